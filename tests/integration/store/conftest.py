from __future__ import annotations

import pytest

pytest.importorskip("ucm_store", reason="native store not built (pip install -e .)")
