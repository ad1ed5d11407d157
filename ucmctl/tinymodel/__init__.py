"""Small random-weight Llama models for tests, benchmarks and the embedded default.

Importing this package needs neither torch nor transformers: they are imported only when a
model is built, so the control plane stays importable on a machine without them.
"""

from ucmctl.tinymodel.build import SIZES, ModelSize, make_model
from ucmctl.tinymodel.cli import app

__all__ = ["SIZES", "ModelSize", "app", "make_model"]
