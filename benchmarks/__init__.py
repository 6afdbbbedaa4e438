"""Benchmarks: each prints the figures its issue asks for, measured in one invocation."""
