"""Load a topology file: YAML -> strict models -> pitfall checks, every problem with a line."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ucmctl.core.errors import Problem, UcmctlError
from ucmctl.topology.checks import check_topology
from ucmctl.topology.model import Topology
from ucmctl.topology.source import KeyPath, Source, load_yaml, parse_yaml
from ucmctl.topology.text import describe, quoted, refused_char, remedy


def load_topology(path: str | Path) -> Topology:
    """Read, validate and check a topology file; raise UcmctlError listing every problem."""
    return topology_from_source(load_yaml(path), base_dir=Path(path).resolve().parent)


def topology_from_source(source: Source, base_dir: Path | None = None) -> Topology:
    # Text that is not one plain line is reported alone: every later message would quote it.
    not_plain = _text_problems(source, source.data, ())
    if not_plain:
        raise UcmctlError(not_plain)
    try:
        topology = Topology.model_validate(source.data)
    except ValidationError as exc:
        raise UcmctlError([_problem(source, err) for err in exc.errors()]) from None
    problems = check_topology(topology, source, base_dir)
    if problems:
        raise UcmctlError(problems)
    if base_dir is not None:
        digest = topology.digest()
        topology = _resolve_local_paths(topology, base_dir)
        topology._written_digest = digest
    return topology


def parse_topology(text: str, name: str = "<string>", base_dir: Path | None = None) -> Topology:
    return topology_from_source(parse_yaml(text, name), base_dir)


def _resolve_local_paths(topology: Topology, base_dir: Path) -> Topology:
    """A `./` or `../` model path of a local-only topology is relative to the topology file."""
    path = topology.model.path
    if not path.startswith(("./", "../")):
        return topology
    model = topology.model.model_copy(update={"path": str((base_dir / path).resolve())})
    return topology.model_copy(update={"model": model})


def _text_problems(source: Source, data: Any, path: KeyPath) -> list[Problem]:
    """Every key and string value that is not one line of plain text (see topology/text.py)."""
    problems: list[Problem] = []
    if isinstance(data, dict):
        for key, value in data.items():
            ch = refused_char(key) if isinstance(key, str) else None
            if ch is not None:
                message = f"key {quoted(key)} holds {describe(ch)}"
                problems.append(source.problem((*path, key), message, fix=remedy(ch)))
            problems += _text_problems(source, value, (*path, key))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            problems += _text_problems(source, item, (*path, i))
    elif isinstance(data, str):
        ch = refused_char(data)
        if ch is not None:
            message = f"{quoted(data)} holds {describe(ch)}"
            problems.append(source.problem(path, message, fix=remedy(ch)))
    return problems


def _problem(source: Source, err: Any) -> Problem:
    loc: KeyPath = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(Topology, loc[:-1])
        valid = ", ".join(parent.model_fields) if parent else ""
        return source.problem(
            loc, f"unknown key {quoted(loc[-1])}", fix=f"valid keys here: {valid}" if valid else None
        )
    if kind == "missing":
        return source.problem(loc, "required key is missing")
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return source.problem(_clean_loc(loc), f"{message}{shown}")


def _clean_loc(loc: KeyPath) -> KeyPath:
    # pydantic adds union-member tags such as 'str' or 'dict[str,any]' to the location.
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in _TAGS)))


_TAGS = {"str", "int", "float", "bool", "list", "dict"}


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The model class that holds the keys at `loc`, following dict values and list items."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = _unwrap(field.annotation)
        elif typing.get_origin(current) in (dict, list):
            current = _unwrap(typing.get_args(current)[-1])
        else:
            return None
    if typing.get_origin(current) is dict:
        return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] and Annotated[...] down to the interesting type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation
