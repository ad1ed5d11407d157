"""Render the files placed on nodes from the jinja2 templates in templates/.

Every value a template writes goes through a filter that makes the file read back as the exact
value: `yaml` for YAML files, `json` for JSON files, `q` for shell words. A value that could not
be written that way (a lone surrogate, which UTF-8 cannot hold) is an error here, not a
connector that fails at start-up.
"""

from __future__ import annotations

import json
import math
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

_PACKAGE = Path(__file__).resolve().parent.parent

# Characters a YAML double-quoted scalar may hold as they are (PyYAML's reader accepts exactly
# these), minus the ones YAML folds or drops: NEL, LINE/PARAGRAPH SEPARATOR and the BOM.
_YAML_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}
_YAML_FOLDED = {"\x85", "\u2028", "\u2029", "\ufeff"}


def templates_dir() -> Path:
    """Inside an installed wheel the templates sit in the package; in a checkout, at the top."""
    for candidate in (_PACKAGE / "_templates", _PACKAGE.parent / "templates"):
        if (candidate / "launch.sh.j2").is_file():
            return candidate
    raise FileNotFoundError("ucmctl templates not found; reinstall ucmctl")


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["json"] = json_value
    env.filters["yaml"] = yaml_value
    env.filters["command_lines"] = command_lines
    return env


def _whole(value: Any) -> Any:
    """32, as the guides write it, not 32.0."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def json_value(value: Any) -> str:
    """One JSON value on one line; text stays UTF-8 so the file holds the value as written."""
    _check_encodable(value)
    return json.dumps(_whole(value), ensure_ascii=False, allow_nan=False)


def yaml_value(value: str | bool | int | float) -> str:
    """One YAML scalar that `yaml.safe_load` reads back as exactly `value`, on one line.

    Text is always double-quoted: a plain `yes`, `null`, `1e3`, `0x10` or `- x` would be
    retyped or misread. JSON's string syntax is not used because its `\\ud83d\\ude80`
    surrogate pairs read back in YAML as two lone surrogates.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _yaml_float(value)
    if isinstance(value, str):
        return '"' + "".join(_yaml_char(ch) for ch in value) + '"'
    raise TypeError(f"no YAML scalar for {type(value).__name__}")


def _yaml_float(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"{value!r} has no portable YAML form")
    if value.is_integer():
        return str(int(value))
    text = repr(value)
    # YAML 1.1 (PyYAML) reads `1e-05` as text: its floats need a dot before the exponent.
    return text.replace("e", ".0e", 1) if "." not in text else text


def _yaml_char(ch: str) -> str:
    if ch in _YAML_SHORT_ESCAPES:
        return _YAML_SHORT_ESCAPES[ch]
    code = ord(ch)
    if 0xD800 <= code <= 0xDFFF:
        raise ValueError("a lone surrogate cannot be written to a UTF-8 file")
    if ch in _YAML_FOLDED or not _yaml_printable(code):
        return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"
    return ch


def _yaml_printable(code: int) -> bool:
    return (
        0x20 <= code <= 0x7E
        or 0xA0 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )


def _check_encodable(value: Any) -> None:
    """Lone surrogates would survive json.dumps only to fail when the file is written."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_encodable(k)
            _check_encodable(v)
    elif isinstance(value, list):
        for v in value:
            _check_encodable(v)


def command_lines(argv: list[str]) -> list[str]:
    """Quoted argv split into readable lines: the command, then one `--flag value` per line."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return [" ".join(words) for words in lines]


def render(template: str, **values: Any) -> str:
    return _environment().get_template(template).render(**values)
