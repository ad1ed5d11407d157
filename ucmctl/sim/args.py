"""Read the `vllm serve` command line the Plan renders; flags the simulator does not model are
named once in a warning and otherwise ignored."""

from __future__ import annotations

import argparse
import json
import os

from ucmctl.core.errors import UcmctlError
from ucmctl.sim.kv_events import parse_events_config
from ucmctl.sim.p2p import PROTOCOLS, bootstrap_port
from ucmctl.sim.profile import Profile, load_profile, prefill_slowdown
from ucmctl.sim.server import SimConfig

# vLLM flags that change nothing in the simulation but are expected: no warning for them.
ACCEPTED_SILENTLY = (
    "--dtype",
    "--seed",
    "--tensor-parallel-size",
    "--data-parallel-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--trust-remote-code",
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ucmctl sim serve", add_help=True, allow_abbrev=False)
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")  # every interface only when asked
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", dest="served_model_name")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--kv-transfer-config")
    p.add_argument("--kv-events-config")
    # The simulator's own flags.
    p.add_argument("--profile", default="zero", help="zero, a name in ucmctl/sim/profiles, or a JSON file")
    p.add_argument("--prefill-us-per-token", type=float, help="override the profile")
    p.add_argument("--decode-step-ms", type=float, help="override the profile")
    p.add_argument("--kv-bytes-per-token", type=int, help="override the profile")
    p.add_argument(
        "--kv-cache-gib", type=float, help="local KV capacity (default: $VLLM_CPU_KVCACHE_SPACE or 4)"
    )
    p.add_argument(
        "--load-seconds",
        type=float,
        default=0.0,
        help="wait this long before opening the port, as a real server loads weights",
    )
    for flag in ACCEPTED_SILENTLY:
        if flag == "--trust-remote-code":
            p.add_argument(flag, action="store_true")
        else:
            p.add_argument(flag)
    return p


def parse_serve_args(argv: list[str]) -> tuple[SimConfig, list[str]]:
    """The simulator config, and the flags it ignores."""
    args, unknown = parser().parse_known_args(argv)
    ignored = [a for a in unknown if a.startswith("-")]
    try:
        profile = load_profile(args.profile)
    except (FileNotFoundError, ValueError) as exc:
        raise UcmctlError.one(str(exc), key="--profile") from None
    overrides = {
        "prefill_us_per_token": args.prefill_us_per_token,
        "decode_step_ms": args.decode_step_ms,
        "kv_bytes_per_token": args.kv_bytes_per_token,
    }
    profile = Profile.model_validate(
        {**profile.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
    )
    slowdown = prefill_slowdown()
    if slowdown != 1.0:  # a regression on purpose (a gate's own test): every prefill costs x times
        dearer = ("base_ms", "prefill_us_per_token", "prefill_attn_ns")
        profile = profile.model_copy(update={k: getattr(profile, k) * slowdown for k in dearer})
    ucm_config, role = _connector(args.kv_transfer_config)
    p2p = _p2p_protocol(args.kv_transfer_config)
    gib = args.kv_cache_gib
    if gib is None:
        gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 4)
    block_bytes = profile.kv_bytes_per_token * args.block_size
    for name in (
        "port",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "block_size",
        "data_parallel_size",
    ):
        if getattr(args, name) < 1:
            raise UcmctlError.one(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.load_seconds <= 3600:
        raise UcmctlError.one("--load-seconds must be between 0 and 3600")
    config = SimConfig(
        model=args.model,
        served_name=args.served_model_name or args.model,
        host=args.host,
        port=args.port,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        # Ranks of external DP are separate servers; internal DP runs every rank here.
        data_parallel_size=1 if args.data_parallel_rank is not None else args.data_parallel_size,
        prefix_caching=args.enable_prefix_caching,
        kv_cache_blocks=int(gib * 2**30 // block_bytes),
        ucm_config_file=ucm_config,
        kv_role=role,
        profile=profile,
        load_seconds=args.load_seconds,
        p2p=p2p,
        bootstrap_port=bootstrap_port(),
        kv_load_failure_policy=_failure_policy(args.kv_transfer_config),
        kv_events=parse_events_config(args.kv_events_config),
        data_parallel_rank=_rank(args.data_parallel_rank),
    )
    return config, ignored


def _rank(raw: str | None) -> int:
    if raw is None:
        return 0
    if not raw.isdigit():
        raise UcmctlError.one(f"--data-parallel-rank {raw!r} is not a rank (0, 1, ...)")
    return int(raw)


def _failure_policy(raw: str | None) -> str:
    """vLLM reads the policy at the top level of --kv-transfer-config; its default is "fail"."""
    return str(json.loads(raw).get("kv_load_failure_policy", "fail")) if raw else "fail"


def _p2p_protocol(raw: str | None) -> str | None:
    """The P2P protocol of the Mooncake connector in --kv-transfer-config (alone or in a Multi)."""
    if not raw:
        return None
    cfg = json.loads(raw)
    connectors = [cfg]
    if cfg.get("kv_connector") == "MultiConnector":
        connectors = cfg.get("kv_connector_extra_config", {}).get("connectors", [])
    for c in connectors:
        if c.get("kv_connector") in PROTOCOLS:
            return PROTOCOLS[c["kv_connector"]]
    return None


def _connector(raw: str | None) -> tuple[str | None, str | None]:
    """The UCM config file of a UCMConnector (alone or inside a MultiConnector), and the role."""
    if not raw:
        return None, None
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UcmctlError.one(f"--kv-transfer-config is not JSON: {exc}") from None
    role = cfg.get("kv_role")
    connectors = [cfg]
    if cfg.get("kv_connector") == "MultiConnector":
        connectors = cfg.get("kv_connector_extra_config", {}).get("connectors", [])
    for c in connectors:
        if c.get("kv_connector") == "UCMConnector":
            path = c.get("kv_connector_extra_config", {}).get("UCM_CONFIG_FILE")
            if not path:
                raise UcmctlError.one("UCMConnector without kv_connector_extra_config.UCM_CONFIG_FILE")
            return str(path), role
    return None, role
