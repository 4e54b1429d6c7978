"""The floors of docs/ARCHITECTURE.md hold in the code: every import of a rocketstore
module, at the top of a file or inside a function (and under TYPE_CHECKING), points to
the importer's own room or to a room on a lower floor; no file imports the public face
(``rocketstore/__init__``); and no two files import each other, directly or round a
circle. The table of rooms is read from the document itself."""

from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")


def rooms() -> dict[str, tuple[int, str]]:
    """room -> (floor, folder), from the document's table."""
    table = {}
    row = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w.]+)`\s*\|\s*`([\w/]+)/`\s*\|")
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if m:
                table[m[2]] = (int(m[1]), m[3])
    return table


ROOMS = rooms()


def module_files() -> dict[str, str]:
    """Dotted module name -> file, for every module of every room."""
    out = {}
    for room, (_, folder) in ROOMS.items():
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".py"):
                leaf = name[:-3]
                out[room if leaf == "__init__" else f"{room}.{leaf}"] = os.path.join(
                    ROOT, folder, name)
    return out


MODULES = module_files()


def room_of(module: str) -> str:
    """The deepest room ``module`` lies in (``rocketstore.storage.x`` -> storage)."""
    return max((r for r in ROOMS if module == r or module.startswith(r + ".")), key=len)


def imports_of(module: str, path: str) -> set[str]:
    """The rocketstore modules ``path`` imports, anywhere in it (a name imported from a
    package counts as its submodule when there is one)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "rocketstore"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "rocketstore":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return found - {module}


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_the_document_names_every_folder_of_the_package():
    assert {"rocketstore.storage", "rocketstore.shm", "rocketstore.client",
            "rocketstore.procs", "rocketstore.cli", "rocketstore"} <= set(ROOMS)
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        mapped = dict(re.findall(r'^"(rocketstore[\w.]*)" = "(\w+)"$', f.read(), re.M))
    assert mapped == {room: folder for room, (_, folder) in ROOMS.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    mine = room_of(module)
    floor = ROOMS[mine][0]
    upward = sorted(t for t in GRAPH[module] if ROOMS[room_of(t)][0] > floor)
    assert not upward, f"{module} (floor {floor}) imports from a higher floor: {upward}"
    if mine != "rocketstore":
        assert "rocketstore" not in GRAPH[module], (
            f"{module} imports the public face; import the module that defines the name")


def test_no_circles():
    """Tarjan's strongly connected components over the file graph: each is one file."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    assert not circles, f"files that import each other round a circle: {circles}"


def test_the_checker_sees_a_broken_floor(tmp_path):
    """The check can fail: an import of the command line from storage is upward."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from rocketstore.cli.main import main\n")
    found = imports_of("rocketstore.storage.bad", str(path))
    assert "rocketstore.cli.main" in found
    assert ROOMS[room_of("rocketstore.cli.main")][0] > ROOMS["rocketstore.storage"][0]
