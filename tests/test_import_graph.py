"""The product's modules form no loop of imports, and only the CLI, the top floor,
composes the launcher with the TUI: read from the source with ast, across engine/,
kernels/, diagnose/ and tui/. Every import counts: one inside a function, and one
under `if TYPE_CHECKING:` (a module that names another's type depends on it)."""
import ast
import os

import pytest

from helpers.run import REPO

pytestmark = pytest.mark.unit

PACKAGES = ("engine", "kernels", "diagnose", "tui")


def module_files() -> dict[str, str]:
    """Module name -> its file, for every .py of PACKAGES."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
                    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(module: str, path: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `module` imports."""
    with open(path) as source:
        tree = ast.parse(source.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node, package)
            named |= {f"{base}.{alias.name}" for alias in node.names}   # a submodule, or
    return {nearest_module(name, modules) for name in named} - {None, module}   # a name in base


def resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module
    base = package.split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def nearest_module(name: str, modules: set[str]) -> str | None:
    """`name` if it is a module of ours, else the module it is a name in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports."""
    files = module_files()
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for peer in sorted(graph[node]):
            if peer not in index:
                visit(peer)
                low[node] = min(low[node], low[peer])
            elif peer in on_stack:
                low[node] = min(low[node], index[peer])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def described(group: list[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
    return "loop of " + ", ".join(group) + ": " + "; ".join(edges)


def test_the_loop_finder_finds_a_loop_and_no_loop_where_there_is_none():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_two_modules_import_each_other_directly_or_in_a_loop(graph):
    assert len(graph) > 100 and graph["diagnose.cli.launch"]   # the walk found the product
    offenders = [described(group, graph) for group in loops(graph)]
    assert not offenders, "\n".join(offenders)


def test_only_the_cli_imports_the_tui(graph):
    offenders = [f"{module} imports {', '.join(sorted(peer for peer in peers if is_tui(peer)))}"
                 for module, peers in sorted(graph.items())
                 if not is_tui(module) and not module.startswith("diagnose.cli")
                 and any(is_tui(peer) for peer in peers)]
    assert not offenders, "\n".join(offenders)


def is_tui(module: str) -> bool:
    return module == "tui" or module.startswith("tui.")
