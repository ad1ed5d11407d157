"""Helpers that launch and check servers, shared by the tests and benchmarks/.

Stdlib (and ucmctl) only; the control plane never imports this package. Here, not under tests/,
so that the benchmarks need no test package on their path.
"""
