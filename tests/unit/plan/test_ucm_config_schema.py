"""One schema for the UCM config file: what the plan renders is what the connector, the store
and the simulator accept, and the pipelines a topology may name are the store's."""

from __future__ import annotations

from pathlib import Path

import yaml

from ucmctl.core.ucm_config import PIPELINES, parse_ucm_config
from ucmctl.plan.model import UCM_CONFIG_FILE, Plan
from ucmctl.sim.external import load_ucm_config
from ucmctl.topology.checks import DEPLOYABLE_PIPELINES


def test_every_rendered_ucm_config_passes_the_schema_and_matches_the_plans_store(
    plans: dict[str, Plan], tmp_path: Path
) -> None:
    seen = 0
    for plan in plans.values():
        assert plan.store is not None
        for p in plan.processes:
            for f in p.files:
                if not f.path.endswith("/" + UCM_CONFIG_FILE):
                    continue
                seen += 1
                assert plan.uses_store(p)
                ucm = parse_ucm_config(yaml.safe_load(f.content))
                assert ucm.store.store_pipeline == plan.store.pipeline
                assert ucm.store.storage_backends == plan.store.backends
                assert ucm.store.cache_buffer_capacity_gb == plan.store.cache_buffer_capacity_gb
                (tmp_path / "ucm.yaml").write_text(f.content)
                cfg, read = load_ucm_config(str(tmp_path / "ucm.yaml"))  # the simulator's reading
                assert cfg["store_pipeline"] == plan.store.pipeline and read == ucm
                assert read.load_timeout_s == 5.0 and read.dump_timeout_s == 10.0  # the defaults
        users = [p.name for p in plan.processes if any(f.path.endswith(UCM_CONFIG_FILE) for f in p.files)]
        assert users == plan.store.users
    assert seen > 0


def test_topology_pipelines_are_the_schemas_with_the_shared_tier() -> None:
    assert set(DEPLOYABLE_PIPELINES) == {p for p in PIPELINES if "Posix" in p.split("|")}
    assert "Cache" in PIPELINES and "Cache" not in DEPLOYABLE_PIPELINES


def test_the_connector_and_the_store_use_the_same_pipelines() -> None:
    import ucm_store
    from ucm_connector.config import KNOWN_TIERS

    assert ucm_store.PIPELINES == PIPELINES
    assert set(KNOWN_TIERS) == set(ucm_store.TIERS)


def test_the_topologys_store_bounds_reach_the_rendered_file(tmp_path: Path) -> None:
    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    source = Path(__file__).resolve().parents[3] / "topologies" / "local-1p1d.yaml"
    text = source.read_text().replace(
        "  cache_buffer_capacity_gb: 2\n",
        "  cache_buffer_capacity_gb: 2\n  load_timeout_s: 2.5\n  dump_timeout_s: 7\n",
    )
    assert "load_timeout_s: 2.5" in text
    (tmp_path / "t.yaml").write_text(text)
    plan = build_plan(load_topology(tmp_path / "t.yaml"))
    files = [f for p in plan.processes for f in p.files if f.path.endswith("/" + UCM_CONFIG_FILE)]
    assert files
    for f in files:
        ucm = parse_ucm_config(yaml.safe_load(f.content))
        assert (ucm.load_timeout_s, ucm.dump_timeout_s) == (2.5, 7.0)


def test_pack_blocks_reaches_the_rendered_file_and_the_digest_only_when_set(tmp_path: Path) -> None:
    from ucmctl.plan.build import build_plan
    from ucmctl.topology.load import load_topology

    source = Path(__file__).resolve().parents[3] / "topologies" / "local-1p1d.yaml"
    digests, packs = {}, {}
    for n in (None, 1, 4):
        extra = f"  pack_blocks: {n}\n" if n is not None else ""
        text = source.read_text().replace(
            "  cache_buffer_capacity_gb: 2\n", f"  cache_buffer_capacity_gb: 2\n{extra}"
        )
        (tmp_path / f"t{n}.yaml").write_text(text)
        topology = load_topology(tmp_path / f"t{n}.yaml")
        digests[n] = topology.digest()
        plan = build_plan(topology)
        files = [f for p in plan.processes for f in p.files if f.path.endswith("/" + UCM_CONFIG_FILE)]
        assert files
        packs[n] = {parse_ucm_config(yaml.safe_load(f.content)).pack_blocks for f in files}
        assert ("pack_blocks" in files[0].content) == (n == 4)
    assert packs == {None: {1}, 1: {1}, 4: {4}}
    # a deployment from before packs keeps its digest; turning packs on is a change
    assert digests[None] == digests[1] != digests[4]
