"""The layer rule of docs/architecture.md, held against the code: every import in kvbench/ (lazy ones inside
functions included: hiding an import in a function does not change which layer depends on which) points to
its own layer or one below, and no modules import each other in a circle."""

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvbench"

# (module pattern, layer), the first match wins; a layer may import its own and the layers below it.
LAYERS = [
    # 6: commands and the Python API: thin, they parse and call the library
    ("kvbench", 6),
    ("kvbench.cli", 6),
    ("kvbench.*.cli", 6),
    ("kvbench.*.command", 6),
    ("kvbench.*.*.command", 6),
    ("kvbench.lm_eval_cli", 6),
    ("kvbench.perplexity_cli", 6),
    ("kvbench.speed_cli", 6),
    ("kvbench.conformance_cli", 6),
    # 5: from what a user asks to rows and reports
    ("kvbench.planning", 5),
    ("kvbench.runner", 5),
    ("kvbench.ray_sweep", 5),
    ("kvbench.lmeval", 5),
    ("kvbench.perplexity", 5),
    ("kvbench.speed", 5),
    ("kvbench.conformance", 5),
    ("kvbench.reporting", 5),
    ("kvbench.reporting.*", 5),
    ("kvbench.serving", 5),
    ("kvbench.serving.*", 5),
    ("kvbench.substrate", 5),
    ("kvbench.substrate.*", 5),
    # 4: the engine: protocols and the batched decoder
    ("kvbench.engine", 4),
    ("kvbench.decoder", 4),
    # 3: presses, learned presses and their training
    ("kvbench.presses", 3),
    ("kvbench.presses.*", 3),
    ("kvbench.learned", 3),
    ("kvbench.learned.*", 3),
    # 2: what is evaluated: tasks and the prompt format
    ("kvbench.tasks", 2),
    ("kvbench.tasks.*", 2),
    # 1: the results store, model loading, the kvpress adapter (the one module on kvpress's internals)
    ("kvbench.results", 1),
    ("kvbench.models", 1),
    ("kvbench.embedded", 1),
    ("kvbench.adapter", 1),
    # 0: vocabulary, errors, validation, provenance, where shipped files are
    ("kvbench.config", 0),
    ("kvbench.validation", 0),
    ("kvbench.errors", 0),
    ("kvbench.provenance", 0),
    ("kvbench.resources", 0),
    ("kvbench.registry", 0),
]


def layer_of(module: str) -> int:
    for pattern, layer in LAYERS:
        if fnmatch.fnmatchcase(module, pattern):
            return layer
    raise AssertionError(f"{module} has no layer in tests/test_architecture.py (and docs/architecture.md)")


def module_files() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_shipped" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The kvbench modules a file imports, anywhere in it: `from a import b` names module a.b if it is one."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "kvbench"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kvbench":
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_every_import_points_to_its_own_layer_or_below():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    graph = import_graph()
    circles = [sorted(component) for component in strongly_connected(graph) if len(component) > 1]
    assert circles == []


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of the import graph."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

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
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return components


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path):
    """The checks above can fail: a lazy import of the runner from the results store is seen as upward, and
    two modules importing each other form a circle."""
    probe = tmp_path / "results.py"
    probe.write_text("def f():\n    from kvbench import runner\n")
    assert imports_of(probe, {"kvbench.results": probe, "kvbench.runner": probe}) == {"kvbench.runner"}
    assert layer_of("kvbench.runner") > layer_of("kvbench.results")
    assert sorted(map(sorted, strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}))) == [
        ["a", "b"],
        ["c"],
    ]
