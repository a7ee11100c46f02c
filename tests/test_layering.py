"""The package's layers import downward only, and the domain never imports the transport.

Every module of `deltabus` belongs to one layer (by where it runs and what it knows); a module
may import only from the layers its own layer lists. grpc and the generated protobuf code stay in
the doors (`rpc/`) and the clients: `cluster/`, `log_tables/`, `offsets/` and the pure modules
work in domain types. The walk reads the source (every import, also those inside functions), so
it needs no Spark and fails on the first edge a change adds against the rules.

Beside the package, `bench/` (`make bench`) and `tests/` are development tools, not installed:
they import deltabus, and deltabus imports neither (an installed deltabus would not find them).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "deltabus"

# Layer by module prefix; the longest matching prefix wins.
LAYERS = {
    "deltabus": "top",
    "deltabus.errors": "pure", "deltabus.config": "pure", "deltabus.metadata": "pure",
    "deltabus.records": "pure", "deltabus.topics": "pure",
    "deltabus.security": "pure",  # principals, ACLs, SCRAM
    "deltabus.listeners": "pure", "deltabus.quotas": "pure", "deltabus.storage": "pure",
    "deltabus.trace": "pure",  # stamps for the latency breakdown: clients and brokers alike
    "deltabus.metrics": "pure",  # a node's Prometheus registry: brokers and the driver alike
    "deltabus.extras": "pure",  # which install a part needs: the clients and the top alike
    "deltabus.group_configs": "pure",  # a group's own settings: coordinator and leaders alike
    # schemas as Confluent's registry knows them, each type's rules (pure: no I/O)
    "deltabus.schemas": "pure",
    "deltabus.log_tables": "log_tables",
    "deltabus.offsets": "offsets",
    "deltabus.cluster.handler": "contracts",
    "deltabus.rpc": "doors",
    "deltabus.rpc.v1": "wire", "deltabus.rpc.codec": "wire", "deltabus.rpc.status": "wire",
    "deltabus.rpc.channel": "wire", "deltabus.rpc.schema_codec": "wire",
    "deltabus.client": "client",
    "deltabus.cluster": "cluster",
    "deltabus.spark": "spark",
    "deltabus.cli": "cli",
}
ALLOWED = {
    "pure": {"pure"},
    "log_tables": {"pure", "log_tables"},
    "offsets": {"pure", "log_tables", "offsets"},
    "contracts": {"pure", "log_tables", "contracts"},
    "wire": {"pure", "wire"},
    "client": {"pure", "wire", "client"},
    "doors": {"pure", "log_tables", "offsets", "contracts", "wire", "doors"},
    # The Cluster in the driver registers the Spark data source: Spark sits below it.
    "cluster": {"pure", "log_tables", "offsets", "contracts", "doors", "spark", "cluster"},
    "spark": {"pure", "log_tables", "wire", "client", "spark"},
    "cli": {"pure", "log_tables", "offsets", "contracts", "wire", "client", "cluster", "spark",
            "cli"},
    "top": {"pure", "client", "cluster", "top"},
}
TRANSPORT = ("grpc", "deltabus.rpc.v1")
NO_TRANSPORT = {"pure", "log_tables", "offsets", "contracts", "cluster"}


def layer(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = LAYERS.get(".".join(parts[:n]))
        if found:
            return found
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def modules(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    out = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if "v1" in parts:
            continue  # generated code
        out[".".join(parts)] = path
    return out


def imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module `module` imports, absolute names (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = {f"{base}.{alias.name}" for alias in node.names
                          if f"{base}.{alias.name}" in MODULES}
            # `from package import module` names the module; the package's __init__ it also
            # runs holds no imports of its own (checked as a module by itself).
            found |= submodules or {base}
    return found


MODULES = modules()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    own = layer(module)
    wrong = sorted(f"{target} ({layer(target)})" for target in imports(module, MODULES[module])
                   if target.startswith("deltabus") and target != "deltabus"
                   and layer(target) not in ALLOWED[own])
    assert wrong == [], f"{module} ({own}) imports upward or sideways"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) in NO_TRANSPORT))
def test_the_domain_does_not_import_the_transport(module: str) -> None:
    wrong = sorted(t for t in imports(module, MODULES[module])
                   if any(t == x or t.startswith(x + ".") for x in TRANSPORT))
    assert wrong == [], f"{module} imports {wrong}"


def test_every_module_has_a_layer() -> None:
    assert len(MODULES) > 50
    for module in MODULES:
        layer(module)


DEVELOPMENT_TOOLS = ("bench", "tests")


def test_the_package_imports_no_development_tool() -> None:
    wrong = sorted(f"{module} imports {target}" for module, path in MODULES.items()
                   for target in imports(module, path)
                   if target.split(".")[0] in DEVELOPMENT_TOOLS)
    assert wrong == []


def test_the_bench_imports_deltabus_not_the_tests() -> None:
    bench = modules(ROOT / "bench")
    assert "bench.run" in bench
    found = {target for module, path in bench.items() for target in imports(module, path)}
    assert "deltabus.client.producer" in found  # the walk sees the bench's imports
    assert sorted(t for t in found if t.split(".")[0] == "tests") == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """An import cycle (even through an import inside a function) makes a module's meaning
    depend on which of the two was imported first; the package has none."""
    graph = {module: {t for t in imports(module, path) if t in MODULES and t != module}
             for module, path in MODULES.items()}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(graph) == []


CLASS_LINES_MAX = 500


def test_no_class_holds_more_than_one_concepts_worth_of_code() -> None:
    """A class past CLASS_LINES_MAX lines is several subsystems in one (the controller, the
    group coordinator and the broker once were): split it where Kafka splits it. Generated
    protobuf code is not ours to split."""
    too_big = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > CLASS_LINES_MAX:
                    too_big.append(f"{path.relative_to(ROOT)}: {node.name}, {lines} lines")
    assert too_big == []
