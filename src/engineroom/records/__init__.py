"""What bench, checks and store share about raw records, below all three.

- ``request``: the raw bench request record (``BenchRequest``) and its readers;
- ``encoding``: the arrival times a streamed record keeps (bench requests and soak turns alike),
  delta-encoded in microseconds, and the readers that decode them;
- ``statistics``: every bench figure, recomputed from those records only;
- ``schema2``: bench records as store schema 2 kept them, rewritten by the store's 2 -> 3 migration.
"""
