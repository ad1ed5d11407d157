"""The metric catalog is the one place a series' name is spelled: no `vllm:`, `ucmctl_proxy_` or
`ucmctl_sim_` string literal in ucmctl/ or connector/ outside it and the engines, and what each
writer and reader uses is the catalog's name."""

from __future__ import annotations

import ast
from pathlib import Path

from ucmctl.core import metric_names as names
from ucmctl.engines import ENGINES

REPO = Path(__file__).resolve().parents[3]
SCANNED = (REPO / "ucmctl", REPO / "connector")
ALLOWED = (REPO / "ucmctl" / "engines", REPO / "ucmctl" / "core" / "metric_names.py")
PREFIXES = ("vllm:", "ucmctl_proxy_", "ucmctl_sim_")  # the engine's, the proxy's, the simulator's


def vllm_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string literal of `path` that starts with a series' prefix, the constant
    parts of f-strings included; comments are not literals, and a docstring that mentions a
    series in its text does not start with one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PREFIXES)
    )


def _scanned_files() -> list[Path]:
    files = [p for root in SCANNED for p in sorted(root.rglob("*.py"))]
    return [p for p in files if not any(p == a or a in p.parents for a in ALLOWED)]


def test_no_series_literal_outside_the_engines_and_the_catalog() -> None:
    files = _scanned_files()
    assert len(files) > 100  # the scan sees the tree
    found = {str(p.relative_to(REPO)): hits for p in files if (hits := vllm_literals(p))}
    assert found == {}


def test_the_scan_finds_a_planted_literal(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Reads `vllm:prefix_cache_hits` (a docstring\'s words)."""\n'
        "# NAME = 'vllm:in_a_comment'\n"
        'NAME = "vllm:num_requests_running"\n'
        "OTHER = f'vllm:ucm_{NAME}_total'\n"
        'PROXY = "ucmctl_proxy_requests_total"\n'
        'FINE = "ucmctl proxy requests"\n'
    )
    assert vllm_literals(planted) == [
        (3, "vllm:num_requests_running"),
        (4, "vllm:ucm_"),
        (5, "ucmctl_proxy_requests_total"),
    ]


def test_the_engines_read_the_catalogs_names() -> None:
    vllm = ENGINES["vllm"].metrics
    assert vllm.local_hits == names.PREFIX_CACHE_HITS == "vllm:prefix_cache_hits"
    assert vllm.requests_running == "vllm:num_requests_running"
    assert vllm.prompt_tokens_by_source == "vllm:prompt_tokens_by_source"
    assert vllm.transfer_source == "external_kv_transfer"


def test_the_ucm_connectors_counter_of_a_stats_field() -> None:
    assert names.ucm_counter("load_blocks") == "vllm:ucm_load_blocks"
    assert names.ucm_counter("load_s") == "vllm:ucm_load_seconds"
    assert names.ucm_counter("save_s") == "vllm:ucm_save_seconds"
    assert names.ucm_counter("lookup_errors_estale") == "vllm:ucm_lookup_errors_estale"
    assert names.MOONCAKE_COUNTERS["transfer_duration"] == "vllm:mooncake_transfer_seconds"
