"""The import graph of loadr/: no cycle, and no arrow up from storage.

Run alone: ``python -m pytest -q tests/test_imports.py``. Every ``import``
in every module counts, also one inside a function (a lazy import is still
an arrow); a submodule's implicit import of its parent package does not, nor
does one under ``if TYPE_CHECKING:`` (it never runs: a name for annotations).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'loadr'
# Layers that storage must never import: it sits under them.
ABOVE_STORAGE = ('loadr.readers', 'loadr.workers', 'loadr.loader')
# Layers that the readers must never import: a reader reads records, what drives it sits
# above it (the loader, its workers and assembly, Mix, pipelines, the command, the adapters).
ABOVE_READERS = ('loadr.loader', 'loadr.workers', 'loadr.assemble', 'loadr.mix', 'loadr.config',
                 'loadr.cli', 'loadr.torch', 'loadr.jax')


def modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """``{dotted name: (file, is a package)}`` of every module of loadr/ (a C
    extension's source stands for the extension: it imports nothing of loadr)."""
    out = {}
    for path in sorted([*PACKAGE.rglob('*.py'), *PACKAGE.rglob('*.c')]):
        parts = list(path.relative_to(ROOT).with_suffix('').parts)
        package = parts[-1] == '__init__'
        if package:
            parts.pop()
        out['.'.join(parts)] = (path, package)
    return out


def _type_checking(node) -> bool:
    """Whether ``node`` is ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def imports() -> dict[str, set[str]]:
    """``{module: the loadr modules it imports}``, read from the source (nothing imported)."""
    mods = modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition('.')[0]
        return name or None

    for name, (path, package) in mods.items():
        if path.suffix != '.py':
            continue
        here = name if package else name.rpartition('.')[0]
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(inner) for node in ast.walk(tree) if _type_checking(node)
                       for stmt in node.body for inner in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    up = here
                    for _ in range(node.level - 1):
                        up = up.rpartition('.')[0]
                    base = f'{up}.{base}' if base else up
                # ``from . import x`` imports the submodule x where there is one.
                targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in mods else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                found = known(target) if target.startswith('loadr') else None
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_the_source():
    graph = imports()
    assert 'loadr.storage.http' in graph['loadr.storage']          # storage_class, lazily
    assert 'loadr.storage.remote' in graph['loadr.storage.http']
    assert 'loadr.storage' in graph['loadr.readers.base']


def test_no_module_of_loadr_imports_itself_through_others():
    assert cycles(imports()) == []


def test_storage_never_imports_the_layers_above_it():
    up = {(name, target) for name, targets in imports().items()
          if name == 'loadr.storage' or name.startswith('loadr.storage.')
          for target in targets
          if any(target == a or target.startswith(a + '.') for a in ABOVE_STORAGE)}
    assert up == set()


def test_a_cycle_is_found():
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]


def test_an_import_for_annotations_only_is_no_arrow():
    tree = ast.parse('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n')
    assert [_type_checking(node) for node in tree.body] == [False, True]


def test_readers_never_import_the_layers_above_them():
    up = {(name, target) for name, targets in imports().items()
          if name == 'loadr.readers' or name.startswith('loadr.readers.')
          for target in targets
          if any(target == a or target.startswith(a + '.') for a in ABOVE_READERS)}
    assert up == set()
