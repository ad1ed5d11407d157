"""What text a topology may hold, and how user text is shown in an error message.

Every string in a topology ends up in a process's argv, environment or a rendered file, or in a
one-line error message. So a string must be one line of plain text: no control characters (NUL
never reaches a process: argv and environ end at it), no line or paragraph separators (YAML and
terminals break lines at them) and no lone surrogates (a `"\\ud83d"` escape: UTF-8 cannot hold
one, so writing the file fails on the node). Emoji, combining marks and joiners are fine.
"""

from __future__ import annotations

import unicodedata

# Unicode categories refused: Cc control (C0, DEL, C1), Cs surrogate, Zl/Zp line/paragraph separator.
REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL byte"}


def refused_char(text: str) -> str | None:
    """The first character that keeps `text` from being one line of plain text, or None."""
    for ch in text:
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            return ch
    return None


def describe(ch: str) -> str:
    """`a newline`, `a lone surrogate '\\ud83d'`, `the control character '\\x1b'`."""
    if ch in _NAMES:
        return _NAMES[ch]
    if unicodedata.category(ch) == "Cs":
        return f"a lone surrogate {ch!r}"
    kind = "control character" if unicodedata.category(ch) == "Cc" else "character"
    return f"the {kind} {ch!r}"


def remedy(ch: str) -> str:
    """What to do about a refused character."""
    if unicodedata.category(ch) == "Cs":
        # YAML reads JSON's "\ud83d\ude80" pair as two halves, not as one character.
        return "write the character itself, or one \\U0001F680-style escape instead of a \\u pair"
    return "write it as one line without control characters; processes cannot receive them"


def escaped(text: str) -> str:
    """`text` with every refused character as a Python escape, everything else as it is."""
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) in REFUSED_CATEGORIES else ch for ch in text)


def quoted(value: object) -> str:
    """A value for a message, as repr writes it: a newline shows as \\n, an emoji as itself."""
    return repr(value)


def one_line(text: str) -> str:
    """The last guard before a message is printed: no raw line break or control character."""
    return escaped(text) if refused_char(text) else text
