"""The import graph of loadr/: no cycle, no arrow up between layers, no private name
imported across modules in the packages that are clean.

Run alone: ``python -m pytest -q tests/test_imports.py``; ``python -m
tests.test_imports`` lists the private names still imported across modules. Every
``import`` in every module counts, also one inside a function (a lazy import is still
an arrow), and importing ``a.b.c`` is an arrow to the packages ``a.b`` (whose
``__init__`` runs first) too, except those the importing module sits in (they run
before it). One under ``if TYPE_CHECKING:`` is no arrow (it never runs: a name for
annotations), but does count as an import of a private name.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'loadr'
# Layers that storage must never import: it sits under them.
ABOVE_STORAGE = ('loadr.readers', 'loadr.workers', 'loadr.loader')
# Layers that the readers must never import: a reader reads records, what drives it sits
# above it (the loader, its workers and assembly, Mix, pipelines, the command, the adapters,
# the conversion).
ABOVE_READERS = ('loadr.loader', 'loadr.workers', 'loadr.assemble', 'loadr.mix', 'loadr.config',
                 'loadr.cli', 'loadr.torch', 'loadr.jax', 'loadr.convert')
# Layers that the stats must never import: they count what the stages above report (a
# fused fn's name comes with the fn, from whoever fused it).
ABOVE_STATS = ('loadr.decode', 'loadr.fns', 'loadr.assemble', 'loadr.readers', 'loadr.workers',
               'loadr.loader', 'loadr.mix', 'loadr.config', 'loadr.cli', 'loadr.torch',
               'loadr.jax')
# In workers/, the window and what it speaks (messages, the ledger of tasks, the slots)
# move tasks, slots and failures; only the worker loop runs an assembler on data, and the
# window is handed one. The data side is above them.
WINDOW_SIDE = ('loadr.workers.window', 'loadr.workers.protocol', 'loadr.workers.ledger',
               'loadr.workers.shm')
DATA_SIDE = ('loadr.assemble', 'loadr.decode', 'loadr.fns', 'loadr.readers', 'loadr.mix',
             'loadr.loader')


def modules(package: pathlib.Path = PACKAGE) -> dict[str, tuple[pathlib.Path, bool]]:
    """``{dotted name: (file, is a package)}`` of every module of ``package`` (loadr/; a C
    extension's source stands for the extension: it imports nothing of loadr)."""
    out = {}
    for path in sorted([*package.rglob('*.py'), *package.rglob('*.c')]):
        parts = list(path.relative_to(package.parent).with_suffix('').parts)
        is_package = parts[-1] == '__init__'
        if is_package:
            parts.pop()
        out['.'.join(parts)] = (path, is_package)
    return out


def _type_checking(node) -> bool:
    """Whether ``node`` is ``if TYPE_CHECKING:`` (or ``if typing.TYPE_CHECKING:``)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def _source(node: ast.ImportFrom, here: str) -> str:
    """The module a ``from ... import`` reads from, made absolute (``here``: the
    package the importing module sits in)."""
    base = node.module or ''
    if node.level:
        up = here
        for _ in range(node.level - 1):
            up = up.rpartition('.')[0]
        base = f'{up}.{base}' if base else up
    return base


def _parsed(package: pathlib.Path = PACKAGE):
    """``(module, the package it sits in, its syntax tree)`` for every Python module."""
    for name, (path, is_package) in modules(package).items():
        if path.suffix == '.py':
            here = name if is_package else name.rpartition('.')[0]
            yield name, here, ast.parse(path.read_text(), str(path))


def imports(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: the modules of the package it imports}``, read from the source (nothing
    imported)."""
    mods = modules(package)
    graph: dict[str, set[str]] = {name: set() for name in mods}

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition('.')[0]
        return name or None

    for name, here, tree in _parsed(package):
        around = set(parents(name))
        typing_only = {id(inner) for node in ast.walk(tree) if _type_checking(node)
                       for stmt in node.body for inner in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _source(node, here)
                # ``from . import x`` imports the submodule x where there is one.
                targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in mods else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                found = known(target) if target.split('.')[0] == package.name else None
                if found is None:
                    continue
                # Importing a.b.c runs a/b/__init__.py first: an arrow to each package on
                # the way, but not to those around this module (they run before it does).
                graph[name].update(up for up in (*parents(found), found)
                                   if up != name and up not in around)
    return graph


def parents(name: str) -> list[str]:
    """The packages ``name`` sits in, outermost first: ``a.b.c`` -> ``['a', 'a.b']``."""
    parts = name.split('.')
    return ['.'.join(parts[:i]) for i in range(1, len(parts))]


def private_imports(package: pathlib.Path = PACKAGE) -> dict[str, list[str]]:
    """``{module: ['where.name', ...]}``: the private (``_``-prefixed, not dunder) names each
    module of the package imports from another of its modules, lazily or for annotations
    too. A private module imported by a module of its own package is no such name (it is
    how a package reaches its parts: ``from . import _order``); the same module imported
    from outside that package is."""
    mods = modules(package)
    out: dict[str, list[str]] = {}
    for name, here, tree in _parsed(package):
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [tuple(alias.name.rpartition('.')[::2]) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _source(node, here)
                pairs = [(base, alias.name) for alias in node.names]
            else:
                continue
            for base, last in pairs:
                if base.split('.')[0] != package.name:
                    continue
                module = f'{base}.{last}'
                if module not in mods:      # a name from module ``base``
                    if _private(last):
                        found.append(module)
                    module = base
                # A private module belongs to the package it sits in.
                parts = module.split('.')
                private = [i for i, part in enumerate(parts) if _private(part)]
                owner = '.'.join(parts[:private[-1]]) if private else None
                if owner is not None and not (name == owner or name.startswith(owner + '.')):
                    found.append(module)
        out[name] = found
    return out


def _private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


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


def test_no_module_keeps_settings_in_a_context_variable():
    """Settings travel as arguments (``loadr.open`` to the reader to its storage; a
    command's ``--storage-option`` passed to each open it makes): none is read from a
    ``contextvars.ContextVar``, which code that holds settings cannot see it depends on."""
    found = sorted(name for name, _, tree in _parsed() for node in ast.walk(tree)
                   if isinstance(node, ast.Import) and any(
                       a.name == 'contextvars' for a in node.names)
                   or isinstance(node, ast.ImportFrom) and node.module == 'contextvars')
    assert found == []


def upward(below: str, above: tuple[str, ...]) -> set[tuple[str, str]]:
    """The arrows from ``below`` (a module, or a package with its modules) into ``above``."""
    return {(name, target) for name, targets in imports().items()
            if _within(name, (below,)) for target in targets if _within(target, above)}


def _within(name: str, places: tuple[str, ...]) -> bool:
    return any(name == place or name.startswith(place + '.') for place in places)


def test_storage_never_imports_the_layers_above_it():
    assert upward('loadr.storage', ABOVE_STORAGE) == set()


def test_readers_never_import_the_layers_above_them():
    assert upward('loadr.readers', ABOVE_READERS) == set()


def test_stats_never_import_the_layers_above_them():
    assert upward('loadr.stats', ABOVE_STATS) == set()


def test_the_window_side_of_workers_never_imports_the_data_side():
    for name in WINDOW_SIDE:
        assert upward(name, DATA_SIDE) == set()


def test_a_cycle_is_found():
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]


def _package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / 'pkg'


def test_a_cycle_through_a_parent_package_is_found(tmp_path):
    # A reader imports pkg.convert.records, which runs pkg/convert/__init__.py first, which
    # imports the readers: a cycle, though no module names the other's package directly.
    package = _package(tmp_path, {
        'pkg/__init__.py': '',
        'pkg/readers/__init__.py': 'from . import base\n',
        'pkg/readers/base.py': 'from ..convert.records import Source\n',
        'pkg/convert/__init__.py': 'from .. import readers\nfrom .records import Source\n',
        'pkg/convert/records.py': 'Source = 1\n'})
    graph = imports(package)
    assert graph['pkg.readers.base'] == {'pkg.convert', 'pkg.convert.records'}
    assert graph['pkg.convert.records'] == set()       # its own package runs before it
    assert cycles(graph) == [['pkg.convert', 'pkg.readers', 'pkg.readers.base']]


def test_an_import_for_annotations_only_is_no_arrow():
    tree = ast.parse('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n')
    assert [_type_checking(node) for node in tree.body] == [False, True]


def test_no_module_imports_a_private_name_of_another():
    # A name another module needs is public in its module (a private module's public
    # names are its package's internals, trio's way); nor does a module reach into
    # another package's private module.
    found = private_imports()
    assert len(found) > 100                 # every module of loadr/ was looked at
    dirty = {name: names for name, names in found.items() if names}
    assert dirty == {}


def test_a_private_name_or_another_packages_private_module_is_found(tmp_path):
    package = _package(tmp_path, {
        'pkg/__init__.py': 'from ._core import run\nfrom . import _core\n',
        'pkg/_core/__init__.py': 'from ._run import run\n',
        'pkg/_core/_run.py': 'from .. import util\nfrom ..util import _helper, __version__\n'
                             'def run(): pass\n',
        'pkg/util.py': 'import pkg._core._run\nfrom pkg._core import run\n'
                       '__version__ = 1\ndef _helper(): pass\n'})
    found = private_imports(package)
    assert found['pkg'] == [] and found['pkg._core'] == []
    assert found['pkg._core._run'] == ['pkg.util._helper']
    # pkg._core._run is _core's; pkg._core (the package) is pkg's, util's own package.
    assert found['pkg.util'] == ['pkg._core._run']


if __name__ == '__main__':
    # Where the private names crossing modules are, module by module.
    found = private_imports()
    for module, names in sorted(found.items()):
        if names:
            print(f'{len(names):3d}  {module}: {", ".join(names)}')
    print(f'{sum(map(len, found.values()))} in {sum(1 for n in found.values() if n)} modules')
