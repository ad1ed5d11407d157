"""What every workload's spec says: its parameters (pydantic fields, whose defaults and
`ucmctl bench`'s options' come from one place, bench/workload_defaults.py; a suite's
`workload:` parses them), how the tables name its phases, its defaults for the run, and how it
runs. A spec module imports pydantic and the light parts of ucmctl only, and its runner inside
`run`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ucmctl.bench.workload_defaults import Param

if TYPE_CHECKING:
    from ucmctl.bench.results import Cell
    from ucmctl.bench.runner import BenchConfig, Progress, Target


class WorkloadSpec(BaseModel):
    """One workload: a subclass sets `kind: Literal["NAME"] = "NAME"`, its parameters as fields,
    `phases`, `default_output_len`, and the methods without a default here."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    # How the tables name a cell's two phases (the JSON keeps "preseed" and "measure" for all).
    phases: ClassVar[dict[str, str]] = {"preseed": "preseed", "measure": "measure"}
    default_output_len: ClassVar[int]  # `--output-len` when not given
    # `ucmctl bench` options this workload alone takes (another refuses them, naming this one)
    own_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WorkloadSpec:
        """`ucmctl bench`: the spec from the options named as its fields. Typer has checked their
        ranges; `load` checks the rest under the options' names (pydantic's validation, whose
        messages name suite keys, is skipped)."""
        return cls.model_construct(**{f: options[f] for f in cls.model_fields if f != "kind"})

    @abstractmethod
    def default_concurrency(self) -> int:
        """`--concurrency` when not given."""

    def load(self, base: Path) -> None:
        """Read the workload's files (paths relative to `base`) and check what the options'
        and the suite's own checks leave, before anything is sent."""

    def take_input_lens(self, lengths: list[int]) -> None:
        """`ucmctl bench`: the input lengths, given or fitted to the server, of a workload whose
        `own_options` has `--input-len`."""
        raise NotImplementedError(f"{self.kind} takes no input lengths")

    def measure_requests(self) -> int | None:
        """Requests one measure phase sends, where the spec alone says (`--fault`'s time is
        checked against it at a request rate)."""
        return None

    def check_rates(self, rates: list[float]) -> None:
        """`ucmctl bench`: refuse `--request-rate`s the workload is not sent at."""

    def check(self, output_len: int, max_model_len: int | None) -> None:
        """`ucmctl bench`: refuse what the server's context cannot take, before anything is sent."""

    def describe(self, cfg: BenchConfig) -> dict[str, Any]:
        """The workload's own parameters, for the result's config."""
        return {"workload": self.kind, **self.model_dump(exclude={"kind"})}

    @abstractmethod
    def in_flight_tokens(self, cfg: BenchConfig, concurrency: int) -> int | None:
        """Tokens the workload keeps in flight at most (the capacity check's side); None: unknown."""

    def streams_per_run(self, cfg: BenchConfig) -> int:
        """Prompt streams one run uses: a sweep's next point starts after them."""
        return 1

    @abstractmethod
    async def run(
        self, cfg: BenchConfig, target: Target, progress: Progress | None, log: Callable[[str], None]
    ) -> list[Cell]:
        """Send the workload once; its cells, the one the tables lead with marked `primary`."""


def field_of(param: Param) -> Any:
    """A spec's field for a workload parameter: its default and bounds (the option's)."""
    return Field(param.default, ge=param.ge, le=param.le)  # None: no bound
