"""The shape of loadr.storage: the remote storage holds its parts, modules share no private
names, and its settings are one typed object passed down (no dict read by key)."""

from __future__ import annotations

import ast
import pathlib
import pickle

import pytest

import loadr.storage
from loadr.storage import remote_storage, settings_for

pytest.importorskip('fsspec')
pytest.importorskip('aiohttp')

STORAGE = pathlib.Path(loadr.storage.__file__).parent


def test_the_remote_storage_holds_its_parts():
    from loadr.storage.caching import CacheHookup
    from loadr.storage.readahead import ReadingAhead
    from loadr.storage.remote import RemoteStorage
    from loadr.storage.versions import Versions
    # Composition, not halves of one class: each part is its own object with its own fields.
    assert not {Versions, CacheHookup, ReadingAhead} & set(RemoteStorage.__mro__)
    settings = settings_for('https://h/x', {'loadr': {'readahead_bytes': 1 << 20}})
    storage = remote_storage('https://h/x', settings)
    assert isinstance(storage.versions, Versions) and isinstance(storage.cache, CacheHookup)
    assert isinstance(storage.ahead, ReadingAhead)
    assert storage.ahead.settings is settings and storage.ahead.buffer.max_bytes == 1 << 20
    assert storage.cache.versions is storage.versions
    storage.versions.learn('https://h/x/a', 10, '"e"')
    copy = pickle.loads(pickle.dumps(storage))
    # What was learnt travels with a copy; the per-process parts are made anew.
    assert copy.versions.conditions('https://h/x/a') == {'If-Match': '"e"'}
    assert copy.ahead is not storage.ahead and copy.cache.versions is copy.versions


def _private_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level and (
                node.level > 1 or (node.module or '').split('.')[0] != ''):
            found += [f'{path.name}: from {"." * node.level}{node.module} import {a.name}'
                      for a in node.names if a.name.startswith('_')]
    return found


def test_no_private_name_is_imported_across_storage_modules():
    found = [line for path in sorted(STORAGE.glob('*.py')) for line in _private_imports(path)]
    assert found == []


def test_no_storage_module_is_over_700_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in STORAGE.glob('*.py')}
    assert {name: n for name, n in sizes.items() if n > 700} == {}


def test_no_storage_module_reads_a_setting_by_its_name():
    # One typed StorageSettings: nothing reads settings['key'] or settings.get('key').
    for path in STORAGE.glob('*.py'):
        text = path.read_text()
        assert "settings[" not in text and "settings.get(" not in text, path.name
