"""`ucmctl bench`: the guides' preseed-and-measure benchmark, scenario suites and a CI gate.

Modules: prompts (token-id prompts), client (the streaming HTTP load generator), metrics
(vLLM's benchmark definitions), hitrate (Prometheus counter deltas), runner (the phases),
report (table, JSON, CSV, Markdown, PNG), suite (scenario matrices that resume), compare
(the regression gate), cli (the typer sub-app); workloads/ (the registry: one spec per workload).
"""
