"""The layout's rules, read from the source: imports point down the layers (kernels <- runtime <- deployments),
and inside runtime/ and deployments/ down their floors; the engine knows nothing of Serve or HTTP, nothing shipped
or benchmarked imports the tests, no two modules import each other round a circle, and no file outgrows a read;
and, run in a fresh interpreter, importing the server loads none of transformers' model code."""

import ast
import subprocess
import sys
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


# Each package's rooms (its subpackages and top-level modules), bottom floor first: a room imports only rooms on
# floors below its own. An entry may name a module inside a room, which then stands on its own floor (the KV
# offload tier's index, which the block manager consults; the rest of the tier is built on the block manager).
FLOORS = {
    "runtime": [
        ("errors", "openmp_env"),
        ("distributed", "outputs"),
        ("text", "layers"),
        ("sampling_params", "pooling", "multimodal", "lora", "kv_tier.index"),
        ("config", "scoring"),
        ("core",),
        ("models", "kv_tier"),
        ("worker",),
        ("speculative",),
        ("engine",),
        ("",),  # the package's own __init__, which re-exports the public API
    ],
    "deployments": [
        ("errors",),
        ("metrics", "tracing", "work_pool", "parsers", "broadcast", "storage"),
        ("media",),
        ("app_config", "api"),
        ("clients", "route_marks"),
        ("replica", "prefix_router", "disaggregated"),
        ("batch",),
        ("http", "autoscaling"),
        ("builder",),
        ("",),
    ],
}


def floor_of(package: str, name: str) -> tuple[int, str]:
    """The floor a module stands on and the room (entry) that places it: the longest entry that holds it."""
    rest = name[len(package) + 1:]
    placed = [(len(entry), level, entry) for level, entries in enumerate(FLOORS[package]) for entry in entries
              if rest == entry or rest.startswith(entry + ".") or (entry == "" and rest == "")]
    assert placed, f"{name} stands on no floor of {package}: add its room to FLOORS"
    _, level, entry = max(placed)
    return level, entry


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_imports_point_down_the_floors(package):
    wrong = []
    for name in modules():
        if not under(name, package):
            continue
        level, room = floor_of(package, name)
        for n in project_imports(name):
            if under(n, package):
                other_level, other_room = floor_of(package, n)
                if other_room != room and other_level >= level:
                    wrong.append(f"{name} imports {n}")
    assert sorted(wrong) == []


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


def test_the_server_starts_without_transformers_model_code():
    """Every Serve replica, engine process and parallel worker imports `deployments` or `runtime` as it starts:
    transformers' model code (modeling_utils, with torch._dynamo and accelerate behind it) would add seconds to
    each. The engine builds its own models; configs, tokenizers and processors need none of it."""
    check = "import sys, deployments; print('transformers.modeling_utils' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
