"""Benchmarks: each prints ratios of instrumented to plain runs measured in one invocation."""
