"""The public surface of ``loadr``, pinned.

Changing what ``import loadr`` offers is a decision: this test makes it a
visible one. Also: every module's ``__all__`` names what it has, and the
docstring examples of loadr/ are collected even where the optional packages
of ``loadr.torch`` and ``loadr.jax`` are missing.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types

import loadr

from .conftest import ROOT

PUBLIC = ['Loader', 'Mix', 'open', 'check', 'Report', 'pipeline', 'LoadrError',
          'errors', 'fns', 'readers', 'writers', 'SharedList', '__version__']
# Modules (a package: with its modules) that import an optional package, or run on import.
OPTIONAL = {'loadr.torch': 'torch', 'loadr.jax': 'jax', 'loadr.__main__': None}


def _optional(name: str) -> bool:
    return any(name == o or name.startswith(o + '.') for o in OPTIONAL)


def test_loadr_all_is_pinned():
    assert sorted(loadr.__all__) == sorted(PUBLIC)
    assert len(set(loadr.__all__)) == len(loadr.__all__)
    for name in loadr.__all__:
        assert hasattr(loadr, name), name
    assert loadr.fns.flip is loadr.fns.REGISTRY['flip']


def test_nothing_else_is_re_exported():
    # Submodules become attributes when imported; any other public name must be in __all__.
    extra = {name for name, value in vars(loadr).items()
             if not name.startswith('_') and not isinstance(value, types.ModuleType)}
    assert extra == {name for name in loadr.__all__ if not name.startswith('_')
                     and not isinstance(getattr(loadr, name), types.ModuleType)}


def _modules(package):
    """Every module under ``package``, imported, but none of the optional ones (nor
    the modules of an optional package: importing even one of them imports the package)."""
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + '.'):
        if _optional(info.name):
            continue
        module = importlib.import_module(info.name)
        yield module
        if info.ispkg:
            yield from _modules(module)


def test_every_all_names_what_its_module_has():
    names = []
    for module in _modules(loadr):
        names.append(module.__name__)
        for name in getattr(module, '__all__', ()):
            assert hasattr(module, name), \
                f'{module.__name__}.__all__ names {name!r}, which it lacks'
    assert 'loadr.mix._weights' in names and 'loadr.readers.bag.reader' in names


def test_doctests_are_collected_without_torch_and_jax():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['jax'] = None; import pytest; "
            "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'loadr']))")
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert 'loadr/fns/names.py::loadr.fns.names.resolve' in done.stdout
    assert 'loadr/torch' not in done.stdout and 'loadr/jax.py' not in done.stdout
