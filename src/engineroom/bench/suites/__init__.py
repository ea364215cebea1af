"""What every longer suite shares (``engineroom bench SUITE``): the suites as data (``specs``), the
salted prompts (``haystack``), what a run is given and resolves (``context``), one request sent and
recorded (``request``), every stream of a multi-stream suite on one event loop (``streams``), the run's
frame (``run``) and the summary recomputed from the records (``summary``). Each kind's own run and
figures live in its folder beside this one: ``depth``, ``concurrency``, ``speculative``, ``agentic``,
``sweep``, ``rate``."""
