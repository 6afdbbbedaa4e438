"""The measurement harness the benchmarks share: what they measure with, not what they measure.

``processes``: child processes, free ports, waiting for a condition; ``stats``: the robust
statistics every ratio is printed with; ``threads``: per-thread CPU clocks and context switches;
``sinks``: a scraper, an OTLP receiver and a discarding span exporter to measure against;
``prometheus``: a Prometheus HTTP API client. Each benchmark keeps its scenarios (the models,
fleets, fault kinds and workloads it runs) in its own modules.
"""
