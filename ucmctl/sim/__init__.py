"""The simulator: an OpenAI-compatible server that imitates vLLM's timing, prefix cache, KV blocks
and metrics, for tests and benchmarks on machines without an accelerator."""
