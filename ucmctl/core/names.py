"""The name rules and the roles: what the topology checks, the Plan is built from, and run
directories and record files are named by."""

from __future__ import annotations

from typing import Literal, get_args

# Deployment and node names: the Plan builds run directories and record files from them.
NAME_RE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"

Role = Literal["mooncake", "prefill", "decode", "mixed", "proxy"]
ServerRole = Literal["prefill", "decode", "mixed"]  # the API servers (vLLM or the simulator)
SERVER_ROLES: tuple[ServerRole, ...] = get_args(ServerRole)
