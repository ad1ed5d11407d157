"""What `ucmctl bench` makes of the workload options: the spec they name, the prompt length
and the vocabulary when not given."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from ucmctl.bench.commands.common import err
from ucmctl.bench.commands.run_options import DEFAULT_VOCAB
from ucmctl.bench.workload_defaults import DEFAULT_INPUT_LEN
from ucmctl.core.errors import UcmctlError

if TYPE_CHECKING:
    from ucmctl.bench.workloads import WorkloadSpec


def spec_of(kind: str, options: dict[str, Any]) -> WorkloadSpec:
    """The workload as typed: the spec a suite parses, from the options named as its fields, its
    file (a trace) read and checked before anything is sent. A field of another workload's own
    options, given, is refused first."""
    from ucmctl.bench.workloads import BY_KIND  # the specs load pydantic: not at start-up

    spec_class = BY_KIND.get(kind)
    if spec_class is None:
        raise UcmctlError.one(
            f"unknown workload '{kind}'", key="--workload", fix=f"use one of {', '.join(BY_KIND)}"
        )
    for other in BY_KIND.values():
        for option in sorted(other.own_options - spec_class.own_options):
            name = option.removeprefix("--").replace("-", "_")
            if name in other.model_fields and options[name] is not None:
                raise foreign_option(kind, option, fix=f"add --workload {other.model_fields['kind'].default}")
    spec = spec_class.from_options(options)
    spec.load(Path())
    return spec


def foreign_option(kind: str, option: str, fix: str | None = None) -> UcmctlError:
    """`option`, given to the `kind` workload, which does not take it: the workloads that do."""
    from ucmctl.bench.workloads import BY_KIND

    owners = " or ".join(k for k, spec in BY_KIND.items() if option in spec.own_options)
    return UcmctlError.one(f"{option} is for the {owners} workload, not {kind}", key=option, fix=fix)


def default_input_len(max_model_len: int | None, output_len: int) -> int:
    """4096 tokens, or what the server's context leaves after --output-len (whole 256s)."""
    if max_model_len is None or DEFAULT_INPUT_LEN + output_len <= max_model_len:
        return DEFAULT_INPUT_LEN
    room = (max_model_len - output_len) // 256 * 256
    if room < 256:
        raise UcmctlError.one(
            f"--output-len {output_len} leaves no room for a prompt in the server's max_model_len "
            f"{max_model_len}",
            key="--output-len",
            fix="pass a smaller --output-len",
        )
    return room


def vocabulary(model_dir: Path | None, vocab: int | None, folders: list[str | None]) -> tuple[int, bool]:
    """(ids to draw below, known to be right): --model-dir, else --vocab, else the first of
    `folders` (the deployment's model, the server's /v1/models root) this machine can read, else
    the default, which the caller checks against the server."""
    from ucmctl.bench.prompts import vocab_from_model

    if model_dir is not None:
        if not model_dir.is_dir():
            raise UcmctlError.one("no such folder", key="--model-dir", file=str(model_dir))
        return vocab_from_model(model_dir), True
    if vocab is not None:
        return vocab, False
    for folder in folders:
        if folder and any((Path(folder) / f).is_file() for f in ("config.json", "tokenizer.json")):
            size = vocab_from_model(Path(folder))
            err.print(f"vocabulary {size} ids, from {escape(folder)}", soft_wrap=True)
            return size, True
    return DEFAULT_VOCAB, False
