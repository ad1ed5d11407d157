from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "store"))
sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("ucm_store", reason="native store not built (pip install -e .)")
