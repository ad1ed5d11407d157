"""The shape a reader can carry: no module of `ucmctl/` over 500 lines, no function or method
over 80 (from its `def` line to its last line: decorators not counted), and no two modules that
import each other. Each check takes the files to read and answers one `file:line: ...` per
offender, so a failure names where to look; the planted cases below prove each one catches its
kind."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ucmctl"
MODULE_LINES = 500
FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _where(path: Path, line: int, root: Path) -> str:
    try:
        shown = path.relative_to(root)
    except ValueError:
        shown = path
    return f"{shown}:{line}"


def long_modules(paths: Iterable[Path], limit: int = MODULE_LINES, root: Path = REPO) -> list[str]:
    """`file:1: N lines` for each file of more than `limit` lines."""
    found = []
    for path in paths:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{_where(path, 1, root)}: {lines} lines (at most {limit})")
    return found


def long_functions(paths: Iterable[Path], limit: int = FUNCTION_LINES, root: Path = REPO) -> list[str]:
    """`file:line: NAME is N lines` for each function or method (nested ones too) longer than
    `limit`, counted from its `def` line to its last line (its decorators left out)."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(
                        f"{_where(path, node.lineno, root)}: {node.name} is {lines} lines (at most {limit})"
                    )
    return found


def module_name(path: Path, root: Path) -> str:
    """The dotted name a file under `root` is imported as (a package's `__init__.py`: the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, in functions too, but none under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _known(name: str, modules: set[str]) -> str | None:
    """The most specific of `modules` that `name` names or lies in (`a.b.C` -> `a.b`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def imports_of(path: Path, root: Path, modules: set[str]) -> dict[str, int]:
    """The modules of `modules` that the file imports, each with the line of its first import:
    relative imports resolved, and `from pkg import name` counted as `pkg.name` where that is a
    module."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        for target in targets:
            known = _known(target, modules)
            if known is not None and known != me:
                found.setdefault(known, node.lineno)
    return found


def import_cycles(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """`a.py:L imports b and b.py:M imports a` for each two modules that import each other."""
    files = {module_name(p, root): p for p in paths}
    modules = set(files)
    graph = {name: imports_of(path, root, modules) for name, path in files.items()}
    found = []
    for a, imported in sorted(graph.items()):
        for b, line in sorted(imported.items()):
            if a < b and a in graph[b]:
                found.append(
                    f"{_where(files[a], line, root)} imports {b} and "
                    f"{_where(files[b], graph[b][a], root)} imports {a}"
                )
    return found


# --- the checkout -------------------------------------------------------------------------------


def test_no_module_is_over_500_lines() -> None:
    found = long_modules(_sources())
    assert not found, "\n".join(found)


def test_no_function_is_over_80_lines() -> None:
    found = long_functions(_sources())
    assert not found, "\n".join(found)


def test_no_two_modules_import_each_other() -> None:
    found = import_cycles(_sources())
    assert not found, "\n".join(found)


def test_the_checks_read_the_whole_package() -> None:
    names = {module_name(p, REPO) for p in _sources()}
    assert {"ucmctl", "ucmctl.cli", "ucmctl.k8s.render", "ucmctl.sim.server"} <= names


# --- planted cases: each check finds what it is for, and only that -----------------------------


def _write(root: Path, files: dict[str, str]) -> list[Path]:
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return sorted(paths)


def test_a_long_module_is_named_with_its_length(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"pkg/big.py": "x = 1\n" * 501, "pkg/fits.py": "x = 1\n" * 500})
    assert long_modules(paths, root=tmp_path) == ["pkg/big.py:1: 501 lines (at most 500)"]


def test_a_long_function_is_named_at_its_def_line(tmp_path: Path) -> None:
    body81 = "".join(f"    x{i} = {i}\n" for i in range(80))  # def + 80 lines: 81
    body80 = "".join(f"        x{i} = {i}\n" for i in range(79))  # def + 79 lines: 80
    source = (
        "import functools\n"
        "\n"
        "\n"
        "@functools.cache\n"  # decorators are not counted
        "@functools.wraps(print)\n"
        f"def fits_with_decorators():\n{body80.replace('        ', '    ')}"
        "\n"
        f"async def too_long():\n{body81}"
        "\n"
        "class C:\n"
        f"    def method(self):\n{body81.replace('    ', '        ')}"
        f"    def fits(self):\n{body80}"
    )
    paths = _write(tmp_path, {"pkg/f.py": source})
    assert long_functions(paths, root=tmp_path) == [
        "pkg/f.py:87: too_long is 81 lines (at most 80)",
        "pkg/f.py:170: method is 81 lines (at most 80)",
    ]


def test_a_nested_function_counts_on_its_own(tmp_path: Path) -> None:
    inner = "".join(f"        y{i} = {i}\n" for i in range(81))
    paths = _write(tmp_path, {"pkg/n.py": f"def outer():\n    def inner():\n{inner}    return inner\n"})
    assert long_functions(paths, root=tmp_path) == [
        "pkg/n.py:1: outer is 84 lines (at most 80)",
        "pkg/n.py:2: inner is 82 lines (at most 80)",
    ]


@pytest.mark.parametrize(
    ("a_imports", "b_imports"),
    [
        ("import pkg.b", "import pkg.a"),
        ("from pkg.b import thing", "from pkg import a"),  # a name of b; the submodule a
        ("from . import b", "from .a import thing"),  # relative, both forms
        ("def f(): from pkg.b import thing", "import pkg.a as alias"),  # inside a function
        ("import pkg.b.deep", "from pkg.a import x"),  # b is a package, deep a module in it
    ],
    ids=["import", "from-import", "relative", "in-a-function", "package"],
)
def test_two_modules_importing_each_other_are_named(tmp_path: Path, a_imports: str, b_imports: str) -> None:
    files = {"pkg/__init__.py": "", "pkg/a.py": f"x = 1\n{a_imports}\n", "pkg/c.py": "import pkg.a\n"}
    if "deep" in a_imports:
        files |= {"pkg/b/__init__.py": "", "pkg/b/deep.py": f"{b_imports}\n"}
        b_file, b_name = "pkg/b/deep.py", "pkg.b.deep"
    else:
        files["pkg/b.py"] = f"{b_imports}\n"
        b_file, b_name = "pkg/b.py", "pkg.b"
    paths = _write(tmp_path, files)
    expected = f"pkg/a.py:2 imports {b_name} and {b_file}:1 imports pkg.a"
    assert import_cycles(paths, root=tmp_path) == [expected]


def test_imports_under_type_checking_and_one_way_imports_are_no_cycle(tmp_path: Path) -> None:
    paths = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import x\n",  # the package imports its module: one way
            "pkg/a.py": "from typing import TYPE_CHECKING\nimport json\nimport pkg.b\nx = 1\n",
            "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import x\n"
            "else:\n    import os\n",
            "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n",
            "pkg/d.py": "import pkg.c\n",
        },
    )
    assert import_cycles(paths, root=tmp_path) == []
    b = tmp_path / "pkg" / "b.py"
    b.write_text(b.read_text() + "    import pkg.a\n")  # in the else: it counts
    assert import_cycles(paths, root=tmp_path) == ["pkg/a.py:3 imports pkg.b and pkg/b.py:6 imports pkg.a"]


def test_module_names_of_files_and_packages(tmp_path: Path) -> None:
    assert module_name(tmp_path / "pkg" / "__init__.py", tmp_path) == "pkg"
    assert module_name(tmp_path / "pkg" / "sub" / "m.py", tmp_path) == "pkg.sub.m"
    paths = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from .. import m\n",
            "pkg/m.py": "from .sub import thing\n",
        },
    )
    modules = {module_name(p, tmp_path) for p in paths}
    assert imports_of(tmp_path / "pkg" / "sub" / "__init__.py", tmp_path, modules) == {"pkg.m": 1}
    assert imports_of(tmp_path / "pkg" / "m.py", tmp_path, modules) == {"pkg.sub": 1}
