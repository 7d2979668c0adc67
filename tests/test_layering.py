"""The package's modules form no import loop: every import statement counts, function-level and
``TYPE_CHECKING`` ones included, so a shared type must live below the modules that use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "rl_moe"
#: The top-level envs/ folder, installed as rl_moe.envs (pyproject's package-dir).
ENVS = (REPO / "envs", "rl_moe.envs")


def module_names(root: Path, prefix: str | None = None) -> dict[str, Path]:
    """Dotted module name -> file, packages named by their folder (``prefix``: the dotted name
    ``root`` installs as, where it differs from its folder's)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        parts = (*(prefix or root.name).split("."), *parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(root: Path, *extra: tuple[Path, str]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from a import b`` names ``a.b`` when that is a
    module, else ``a``); ``extra`` folders join the package under their installed names."""
    modules = module_names(root)
    for folder, prefix in extra:
        modules.update(module_names(folder, prefix))
    top = root.name

    def owner(name: str) -> str | None:
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
                targets = [owner(f"{node.module}.{a.name}") or owner(node.module) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.split(".")[0] == top]
            else:
                continue
            graph[name].update(t for t in targets if t and t != name)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_type_only_loop(tmp_path: Path) -> None:
    pkg = tmp_path / "rl_moe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from rl_moe.sub.b import B\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rl_moe.sub import a\n")
    (pkg / "c.py").write_text("def f():\n    import rl_moe.sub.a\n")
    assert loops(import_graph(pkg)) == [["rl_moe.sub.a", "rl_moe.sub.b"]]
    (pkg / "sub" / "b.py").write_text("B = 1\n")
    assert loops(import_graph(pkg)) == []


def test_no_module_of_the_package_imports_itself_through_a_loop() -> None:
    assert loops(import_graph(PACKAGE, ENVS)) == []


def test_envs_never_import_the_scheduler() -> None:
    graph = import_graph(PACKAGE, ENVS)
    envs = {m for m in graph if m.startswith("rl_moe.envs")}
    assert len(envs) >= 10
    upward = sorted(f"{m} -> {t}" for m in envs for t in graph[m] if t.startswith("rl_moe.continual"))
    assert upward == []
    # and the scheduler does reach them: the graph sees the installed names
    assert any(t.startswith("rl_moe.envs") for t in graph["rl_moe.continual.scheduler"])


def test_pyproject_lists_every_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py")}
    assert set(data["packages"]) == folders | {"rl_moe.envs"}
    assert data["package-dir"] == {"rl_moe.envs": "envs"}


def uncommented_lazy_imports(root: Path) -> list[str]:
    """Imports inside functions without a comment on their line or the line above saying why."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2]
                    if "#" not in here and not above.strip().startswith("#"):
                        found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_imports_inside_functions_say_why(tmp_path: Path) -> None:
    (tmp_path / "rl_moe").mkdir()
    (tmp_path / "rl_moe" / "m.py").write_text("def f():\n    import json\n\n\ndef g():\n    import ray  # lazy: optional\n")
    assert uncommented_lazy_imports(tmp_path / "rl_moe") == ["rl_moe/m.py:2"]
    assert uncommented_lazy_imports(PACKAGE) == []
    assert uncommented_lazy_imports(ENVS[0]) == []
