"""Read a YAML file into plain data, keeping the line of every key for error messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ucmctl.core.errors import Problem, UcmctlError
from ucmctl.topology.text import describe, one_line, quoted

KeyPath = tuple[str | int, ...]


@dataclass
class Source:
    """A parsed YAML document and where each of its keys came from."""

    path: str
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int | None:
        """Line of the deepest known prefix of key_path (a missing key points at its parent)."""
        for end in range(len(key_path), -1, -1):
            line = self.lines.get(tuple(key_path[:end]))
            if line is not None:
                return line
        return None

    def problem(self, key_path: KeyPath, message: str, fix: str | None = None) -> Problem:
        # Messages quote user text already; one_line is the guard that keeps every problem on
        # one line even where a message forgot to.
        return Problem(
            one_line(message),
            file=one_line(self.path),
            key=dotted(key_path) or None,
            line=self.line_of(key_path),
            fix=one_line(fix) if fix is not None else None,
        )


def dotted(key_path: KeyPath) -> str:
    """`('prefill', 'nodes', 0)` -> `prefill.nodes[0]`; a key that is not plain text is quoted:
    `nodes.a.env.'A\\nB'`."""
    out = ""
    for part in key_path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        if not text or not text.isprintable() or any(c in text for c in " '\"[]\\"):
            text = quoted(part)
        out += f".{text}" if out else text
    return out


def load_yaml(path: str | Path) -> Source:
    """Parse one YAML mapping; syntax errors and duplicate keys become UcmctlError with a line."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UcmctlError.one("file not found", file=one_line(name), fix="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UcmctlError.one(one_line(f"cannot read: {exc}"), file=one_line(name)) from None
    return parse_yaml(text, name)


def parse_yaml(text: str, name: str = "<string>") -> Source:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        reason = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark and exc.problem_mark:
            reason += f" ({exc.context} that started on line {exc.context_mark.line + 1})"
        problem = f"YAML syntax error: {reason}"
        raise UcmctlError([Problem(one_line(problem), file=one_line(name), line=line)]) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow in a file, e.g. NUL
        raise UcmctlError(
            [
                Source(name, None).problem(
                    (),
                    f"the file holds {describe(chr(exc.character))} (character {exc.position + 1}), "
                    "which YAML does not allow",
                    fix="remove it, or write it as an escape in a double-quoted string",
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise UcmctlError([Source(name, None).problem((), f"YAML error: {exc}")]) from None
    source = Source(name, None)
    if root is None:
        raise UcmctlError([source.problem((), "the file is empty", fix="see topologies/ for examples")])
    source.data = _build(root, (), source)
    if not isinstance(source.data, dict):
        raise UcmctlError([source.problem((), "the top level must be a mapping of keys")])
    return source


def _build(node: yaml.Node, path: KeyPath, source: Source) -> Any:
    source.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.value in seen:
                raise UcmctlError(
                    [
                        Problem(
                            f"duplicate key {quoted(key_node.value)}",
                            file=one_line(source.path),
                            key=dotted((*path, key_node.value)),
                            line=key_node.start_mark.line + 1,
                            fix="keep only one of them",
                        )
                    ]
                )
            seen.add(key_node.value)
        _constructor.flatten_mapping(node)  # `<<: *anchor` entries first, explicit keys win
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, source)
            if isinstance(key, (dict, list)):
                raise UcmctlError([source.problem(path, "a mapping key must be a plain value")])
            key_path: KeyPath = (*path, key)
            source.lines[key_path] = key_node.start_mark.line + 1
            out[key] = _build(value_node, key_path, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), source) for i, item in enumerate(node.value)]
    return _scalar(node, source)


def _scalar(node: yaml.Node, source: Source) -> Any:
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return _build(node, (), Source(source.path, None))
    try:
        return _constructor.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        problem = one_line(f"cannot read value: {exc.problem}")
        raise UcmctlError(
            [Problem(problem, file=one_line(source.path), line=node.start_mark.line + 1)]
        ) from None


# Resolves scalars with SafeLoader's rules (ints, floats, bools, nulls, strings).
_constructor = yaml.SafeLoader("")
