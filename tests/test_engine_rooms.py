"""The engine's rooms keep the rules their docstrings state (engine/__init__.py): imports
go one way, entrypoints -> bench -> core -> executor -> worker -> model, every room may
import the top level, which imports no room, and no engine file is over 300 lines.
Read from the source with ast: nothing is imported."""
import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ENGINE = Path(__file__).resolve().parents[1] / "engine"
ORDER = ["entrypoints", "bench", "core", "executor", "worker", "model"]
MAX_LINES = 300


def _room(module: str) -> str | None:
    """The room of engine.ROOM.x, None for a top-level module or the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ORDER) else None


def _engine_imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of engine code in engine/."""
    pairs = []
    for path in ENGINE.rglob("*.py"):
        module = ".".join(path.relative_to(ENGINE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine"):
                pairs += [(module, node.module)]
            elif isinstance(node, ast.Import):
                pairs += [(module, alias.name) for alias in node.names if alias.name.startswith("engine")]
    return pairs


def test_the_rooms_import_one_way():
    pairs = _engine_imports()
    assert pairs, "no engine imports found: the walk is broken"
    upward = [(importer, imported) for importer, imported in pairs
              if _room(importer) and _room(imported)
              and ORDER.index(_room(imported)) < ORDER.index(_room(importer))]
    top_into_rooms = [(importer, imported) for importer, imported in pairs
                      if _room(importer) is None and _room(imported)
                      and importer != "engine.__main__"]
    assert upward == [] and top_into_rooms == []


def test_every_room_states_its_rules():
    for room in ORDER:
        doc = ast.get_docstring(ast.parse((ENGINE / room / "__init__.py").read_text()))
        assert doc and "Rules:" in doc, room


def test_no_engine_file_is_over_300_lines():
    lengths = {str(path.relative_to(ENGINE)): len(path.read_text().splitlines())
               for path in ENGINE.rglob("*.py")}
    assert len(lengths) > 30
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
