"""The sweep suite (``engineroom bench sweep``): cells of N streams x prompt size within a budget; the
cells, the knee and the recommended slot count (``knee``), the run (``run``)."""
