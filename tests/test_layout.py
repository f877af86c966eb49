"""The layout's rules, read from the source: imports point down the layers (kernels <- runtime <- deployments),
the engine knows nothing of Serve or HTTP, nothing shipped or benchmarked imports the tests, no two modules import
each other round a circle, and no file outgrows a read."""

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "runtime", "deployments", "testing", "benchmarks", "tests")
MAX_LINES = 400


@cache
def modules() -> dict[str, Path]:
    """Every project module by dotted name (a package by its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def imports(name: str) -> frozenset[str]:
    """The absolute names a module imports, wherever in it (a function's own imports count too)."""
    tree = ast.parse(modules()[name].read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def project_imports(name: str) -> set[str]:
    """The project modules a module imports (`from a import b` is module a.b where that is one, else a)."""
    return {n for n in imports(name) if n in modules()}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize(("package", "forbidden"), [
    ("kernels", ("runtime", "deployments", "testing", "tests", "ray", "fastapi", "starlette", "pydantic")),
    ("runtime", ("deployments", "testing", "tests", "ray.serve", "fastapi", "starlette", "uvicorn", "http",
                 "requests", "aiohttp", "httpx")),
    ("deployments", ("testing", "tests", "benchmarks")),
    ("testing", ("tests", "benchmarks")),
    ("benchmarks", ("tests",)),
])
def test_imports_point_down(package, forbidden):
    wrong = sorted(f"{name} imports {n}" for name in modules() if under(name, package)
                   for n in imports(name) if any(under(n, f) for f in forbidden))
    assert wrong == []


def test_no_import_circles():
    """Tarjan's strongly connected components over module imports; a package's __init__ that re-exports its own
    modules is not a circle with them."""
    graph = {name: {n for n in project_imports(name) if not under(name, n)} for name in modules()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    assert circles == []


def test_no_file_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_runtime_top_level_is_small():
    """The engine's own rooms are its subpackages; beside them only the few modules every room shares."""
    top = sorted(p.name for p in (ROOT / "runtime").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, top
