"""The topology reference, generated from the models so it never drifts from the code."""

from __future__ import annotations

import json
import types
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ucmctl.topology.model import Topology


def json_schema() -> str:
    return json.dumps(Topology.model_json_schema(), indent=2) + "\n"


def markdown() -> str:
    """One table per model, in the order a topology file reads."""
    out = [
        "# Topology file reference",
        "",
        "Generated from `ucmctl/topology/model.py` by `ucmctl schema --format markdown`; do not edit.",
        "Unknown keys are errors. See README.md for what each layout looks like.",
    ]
    seen: set[type[BaseModel]] = set()
    queue: list[tuple[str, type[BaseModel]]] = [("topology (the file)", Topology)]
    while queue:
        title, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out += ["", f"## {title}", ""]
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        if doc and model is not Topology:
            out += [doc, ""]
        out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            kind, nested = _type(field.annotation)
            for n in nested:
                queue.append((f"{n.__name__} (in `{name}`)", n))
            default = "required" if field.is_required() else _default(field.default, field.default_factory)
            out.append(f"| `{name}` | {kind} | {default} | {field.description or ''} |")
    return "\n".join(out) + "\n"


def _default(value: Any, factory: Any) -> str:
    if factory is not None:
        value = factory()
    if value is PydanticUndefined:
        return ""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value)}`"


def _type(annotation: Any) -> tuple[str, list[type[BaseModel]]]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        parts = [_type(a) for a in args if a is not type(None)]
        text = " or ".join(p[0] for p in parts)
        return (text + (" or null" if type(None) in args else ""), [m for p in parts for m in p[1]])
    if origin is list:
        inner, nested = _type(args[0])
        return f"list of {inner}", nested
    if origin is dict:
        inner, nested = _type(args[1])
        return f"map of {inner}", nested
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args), []
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation), []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.__name__, [annotation]
    if annotation is Any:
        return "any", []
    return getattr(annotation, "__name__", str(annotation)), []
