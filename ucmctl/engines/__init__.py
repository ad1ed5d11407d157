"""Engines: what serving with vLLM or the simulator means to ucmctl."""
