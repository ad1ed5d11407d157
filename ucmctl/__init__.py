"""ucmctl: deploy and measure vLLM with the UCM KV-cache store."""

__version__ = "0.1.0"
