"""The native `Cache|Posix` block store (built from csrc/)."""

from ucm_store._native import FORMAT_VERSION

__all__ = ["FORMAT_VERSION"]
