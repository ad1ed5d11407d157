"""The simulator's timing model: what one engine step costs, from a profile file or flags.

A step runs the decode token of every running request plus a budget of prefill tokens, as
vLLM's scheduler does. Its duration is

    step_ms = max(base_ms (when the step prefills), decode_step_ms (when any request decodes))
            + sum over prefill chunks of n * (prefill_us_per_token + prefill_attn_ns * (c + n/2)) / 1000
            + decode_seq_us * decode_batch / 1000 + decode_ctx_ns * decode_context_tokens / 1e6

where a chunk of n tokens starts at context c (attention makes later tokens dearer). A step's
fixed cost (reading the weights, the step's own work) is paid once: a step that prefills beside
streams that decode pays the larger of the two, not both (the real vLLM's streams stalled 62-69
ms beside a 320-token prompt; both fixed costs charged made it 93 ms).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.core.errors import UcmctlError

PROFILES_DIR = Path(__file__).parent / "profiles"


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    base_ms: float = Field(default=0.0, ge=0, description="fixed cost of a step that prefills")
    prefill_us_per_token: float = Field(default=0.0, ge=0)
    prefill_attn_ns: float = Field(default=0.0, ge=0, description="per token per token of context")
    decode_step_ms: float = Field(default=0.0, ge=0, description="fixed cost of a step that decodes")
    decode_seq_us: float = Field(default=0.0, ge=0, description="per decoding request")
    decode_ctx_ns: float = Field(default=0.0, ge=0, description="per context token of decoding requests")
    kv_bytes_per_token: int = Field(
        default=1024, ge=1, description="KV bytes of one token (all layers): sizes the external tier's blocks"
    )
    source: str = Field(default="", description="how the numbers were obtained")

    def prefill_ms(self, tokens: int, context: int) -> float:
        return (
            tokens * (self.prefill_us_per_token + self.prefill_attn_ns * (context + tokens / 2) / 1000) / 1000
        )

    def decode_ms(self, batch: int, context_tokens: int) -> float:
        if batch == 0:
            return 0.0
        return (
            self.decode_step_ms
            + self.decode_seq_us * batch / 1000
            + self.decode_ctx_ns * context_tokens / 1e6
        )


BUILTIN = {"zero": Profile(name="zero", source="no simulated cost")}


def load_profile(name_or_path: str) -> Profile:
    """A built-in name (`zero`, or a file in ucmctl/sim/profiles without .json) or a JSON path."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    candidates = [Path(name_or_path), PROFILES_DIR / f"{name_or_path}.json"]
    for path in candidates:
        if path.is_file():
            data = json.loads(path.read_text())
            data.pop("points", None)  # calibration measurements kept beside the fit
            return Profile.model_validate(data)
    known = sorted([*BUILTIN, *(p.stem for p in PROFILES_DIR.glob("*.json"))])
    raise FileNotFoundError(f"no sim profile '{name_or_path}' (built in: {', '.join(known)}, or a JSON file)")


SLOWDOWN_VARIABLE = "UCMCTL_SIM_PREFILL_SLOWDOWN"


def prefill_slowdown() -> float:
    """$UCMCTL_SIM_PREFILL_SLOWDOWN: a factor on every simulated prefill's cost, for testing a
    regression gate with a slowdown that leaves the topology and the provenance as they were
    (the simulator logs it at its start). 1 when unset."""
    text = os.environ.get(SLOWDOWN_VARIABLE, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 < value <= 1000):
        raise UcmctlError.one(f"'{text}' is not a factor between 0 and 1000", key=SLOWDOWN_VARIABLE)
    return value
