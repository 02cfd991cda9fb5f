"""The layer rule of docs/architecture.md, held against the code: every import in kvbench/ (lazy ones inside
functions included: hiding an import in a function does not change which layer depends on which) points to
its own layer or one below, and no modules import each other in a circle."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvbench"

# The package's folders are its layers: (folder, layer), a layer may import its own and the layers below it.
FOLDERS = {
    "cli": 7,  # the commands: thin, they parse and call the library (the only place that imports click)
    "diagnostics": 6,  # each press on its own: its cost (speed) and its conformance, planned by the harness
    "harness": 5,  # from what a user asks to rows: planning, runner, Ray, lm-eval, perplexity, interop
    "serving": 5,  # prefix caching as a serving benchmark: trace, store, replay, bench
    "reporting": 5,  # from rows to reports
    "engine": 4,  # the protocols and the batched decoder
    "presses": 3,  # the registry of presses, our heuristic presses and codecs
    "learned": 3,  # the learned presses and their training
    "tasks": 2,  # what is evaluated: task families, metrics, suites, the prompt format
    "store": 1,  # the results store
    "bridge": 1,  # model loading and the adapter, the one module on kvpress's and transformers' internals
    "core": 0,  # vocabulary, errors, validation, provenance, shipped files, registries
}
API = 7  # kvbench/__init__.py: the Python API
PUBLIC = {"kvbench.lmeval"}  # stable public paths beside the API, at its layer: re-exports only


def layer_of(module: str) -> int:
    """The layer of a module: its folder's (`FOLDERS`); the package itself is the API."""
    parts = module.split(".")
    if parts == ["kvbench"] or module in PUBLIC:
        return API
    if parts[1] not in FOLDERS:
        raise AssertionError(f"{module} is in no folder of FOLDERS in tests/project/test_architecture.py")
    return FOLDERS[parts[1]]


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
    probe.write_text("def f():\n    from kvbench.harness import runner\n")
    assert imports_of(probe, {"kvbench.store.results": probe, "kvbench.harness.runner": probe}) == {
        "kvbench.harness.runner"
    }
    assert layer_of("kvbench.harness.runner") > layer_of("kvbench.store.results")
    assert sorted(map(sorted, strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}))) == [
        ["a", "b"],
        ["c"],
    ]


def test_every_module_is_in_a_folder_of_a_layer():
    public = sorted(f"{module.split('.')[1]}.py" for module in PUBLIC)
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", *public]
    folders = {
        module.split(".")[1] for module in module_files() if module != "kvbench" and module not in PUBLIC
    }
    assert folders == set(FOLDERS)


def test_public_modules_only_re_export():
    """A stable public path (`PUBLIC`) holds imports and `__all__`, no code of its own."""
    for module in PUBLIC:
        tree = ast.parse(module_files()[module].read_text())
        kinds = {type(node) for node in tree.body} - {ast.Expr}  # the docstring
        assert kinds <= {ast.Import, ast.ImportFrom, ast.Assign}, module


def documented_layers(page: str) -> tuple[dict[str, int], int | None]:
    """The table of layers of docs/architecture.md: each folder a row names (`harness/`, at the start of its
    cell or after "; ") at that row's layer, and the layer of the row that names `kvbench/__init__.py`."""
    folders, api = {}, None
    for line in page.splitlines():
        row = re.match(r"\| (\d+) [^|]*\| (.*?) \|", line)
        if row:
            folders |= {folder: int(row[1]) for folder in re.findall(r"(?:^|; )`(\w+)/`", row[2])}
            api = int(row[1]) if "`kvbench/__init__.py`" in row[2] else api
    return folders, api


def test_the_documented_layers_are_the_folders():
    """docs/architecture.md's table and `FOLDERS` are one list: a folder moved or added in one is in the
    other, at the same layer."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert documented_layers(page) == (FOLDERS, API)


def test_click_is_imported_in_cli_only():
    """The library is called from Python as from the command line: options, help and exit codes live in
    kvbench/cli/ alone."""
    importers = [
        module
        for module, path in module_files().items()
        if not module.startswith("kvbench.cli")
        and any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and any(
                (getattr(node, "module", None) or alias.name).split(".")[0] == "click" for alias in node.names
            )
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert importers == []


# Package `__init__.py` files that still hold code of their own (issue 57): this set only shrinks.
INITS_WITH_CODE = {
    "kvbench",  # the Python API: names loaded on first use (a module `__getattr__`) and the console script
}


def test_package_inits_only_re_export():
    """A package's `__init__.py` holds its docstring, imports and `__all__`: what it defines lives in a
    module named after it (`presses/registry.py`, `tasks/suites.py`, `cli/commands.py`, ...), which is the
    module to patch in a test."""
    holding = set()
    for module, path in module_files().items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        kinds = {type(node) for node in tree.body} - {ast.Expr}  # the docstring
        assigned = {
            ast.unparse(target)
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
        }
        if not kinds <= {ast.Import, ast.ImportFrom, ast.Assign} or not assigned <= {"__all__"}:
            holding.add(module)
    assert holding == INITS_WITH_CODE


def documented_imports() -> list[str]:
    """The imports of kvbench that the docs and the README show: lines of their Python blocks, and code
    spans in their text (`import kvbench.lmeval`)."""
    pages = [*sorted((PACKAGE.parent / "docs").glob("*.md")), PACKAGE.parent / "README.md"]
    found = set()
    for page in pages:
        text = page.read_text()
        found |= {span for span in re.findall(r"`((?:import|from) kvbench[^`]*)`", text)}
        found |= {
            line.strip()
            for line in text.splitlines()
            if line.strip().startswith(("import kvbench", "from kvbench")) and not line.rstrip().endswith("(")
        }
    return sorted(found)


def test_the_documented_imports_work():
    """What the docs tell users to import (`import kvbench.lmeval`, `from kvbench import Protocol`, ...)
    imports, and so does every name of the API and of the public modules (`PUBLIC`)."""
    lines = documented_imports()
    assert "import kvbench.lmeval" in lines
    for line in lines:
        exec(line, {})
    import importlib

    for module in ["kvbench", *PUBLIC]:
        loaded = importlib.import_module(module)
        assert all(hasattr(loaded, name) for name in getattr(loaded, "__all__", [])), module
