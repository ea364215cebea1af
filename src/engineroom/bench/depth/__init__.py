"""The depth suite (``engineroom bench depth``): TTFT, prefill and decode with 1K-90K tokens already in
context, on salted haystacks; the depths that fit (``sizes``) and the run with its prefix-cache guard
(``run``)."""
