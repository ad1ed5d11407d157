"""`storage.pack_blocks` end to end on this machine: a centralized 1P1D of the simulator writes
its prompts' blocks as packs through the real store, and decode finds exactly the blocks it
finds when every block is a file of its own (the same seed, one prefill, one decode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.deploy.test_local_lifecycle import deployed, nothing_left, topology, ucmctl  # noqa: F401

pytestmark = pytest.mark.slow

BENCH = ["bench", "--prefix-ratio", "0.8", "--input-len", "1024", "--output-len", "4",
         "--num-prompts", "16", "--request-rate", "8", "-q"]  # fmt: skip


def run(tmp: Path, pack_blocks: int) -> tuple[dict, list[Path]]:
    """(the measured phase's hit counts by role, the store's files) of one deployment's bench."""
    base = tmp / f"packs-{pack_blocks}"
    workdir, home = base / "work", base / "home"
    base.mkdir()
    topo = topology(base, f"t-packs-{pack_blocks}", workdir)
    topo.write_text(topo.read_text().replace("0.25}", f"0.25, pack_blocks: {pack_blocks}}}"))
    with deployed(home, topo, workdir):
        save = base / "run.json"
        done = ucmctl(home, *BENCH, "--save", str(save), timeout=300)
        assert done.returncode == 0, done.stderr
    (cell,) = json.loads(save.read_text())["cells"]
    files = [p for p in (workdir / "store").rglob("*") if p.is_file() and p.parent.name != "corrupt"]
    return cell["measure"]["hit_rate"]["by_role"], files


def test_packs_lose_no_hit_and_write_a_file_per_pack(tmp_path: Path) -> None:
    plain, plain_files = run(tmp_path, 1)
    packed, packed_files = run(tmp_path, 4)
    assert not any(p.name.endswith(".pack") for p in plain_files)
    packs = [p for p in packed_files if p.name.endswith(".pack")]
    # 16 prompts of 8 blocks (1024 tokens, 128 a block) in packs of 4: most blocks in packs
    assert len(packs) >= 16, sorted(p.name for p in packed_files)
    assert len(packed_files) < len(plain_files) / 2, (len(packed_files), len(plain_files))
    decode, decode_packed = plain["decode"], packed["decode"]
    assert decode["external_hits"] > 0
    assert decode_packed["external_hits"] == decode["external_hits"], (decode_packed, decode)
    for role in (packed["prefill"], decode_packed):
        errors = {k: v for k, v in role.items() if k.startswith("ucm_") and v}
        assert errors == {}, errors
