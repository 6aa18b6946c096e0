"""The reference fixtures in tests/fixtures are what their MANIFEST.json says, to the byte.

They were written once by the original libraries (tests/fixtures/README.md) and
are never regenerated: a file changed, added or lost here (a line-ending filter,
a test that wrote beside them, an edit) would make every reader test compare
against something else, so the files are checked against the MANIFEST's sizes
and sha256. A copy named by LOADR_FIXTURES is checked the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from .conftest import FIXTURES, IN_REPO, ROOT

COPIES = [IN_REPO] + ([FIXTURES] if FIXTURES.resolve() != IN_REPO.resolve() else [])


def files_in(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every file under ``root`` by its path relative to it ('/'-separated), but the
    MANIFEST itself and Python's bytecode cache (synth.py imported by a test)."""
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob('*'))
            if p.is_file() and p.name != 'MANIFEST.json' and '__pycache__' not in p.parts}


@pytest.mark.parametrize('root', COPIES, ids=[str(c) for c in COPIES])
def test_the_fixtures_are_byte_equal_to_their_manifest(root):
    if root is not IN_REPO and not (root / 'MANIFEST.json').is_file():
        pytest.skip(f'no fixtures at LOADR_FIXTURES={root}')
    listed = json.loads((root / 'MANIFEST.json').read_text(encoding='utf-8'))['files']
    present = files_in(root)
    assert sorted(present) == sorted(listed), (
        f'missing: {sorted(set(listed) - set(present))}, '
        f'not in the MANIFEST: {sorted(set(present) - set(listed))}')
    wrong = []
    for rel, path in present.items():
        data = path.read_bytes()
        if len(data) != listed[rel]['size'] or \
                hashlib.sha256(data).hexdigest() != listed[rel]['sha256']:
            wrong.append(rel)
    assert wrong == [], f'differ from MANIFEST.json: {wrong}'
    # Every reader's reference dataset is there (not an empty inventory passing).
    datasets = json.loads((root / 'MANIFEST.json').read_text(encoding='utf-8'))['datasets']
    assert {'gulp', 'bag', 'bag_sharded', 'ffrecord_single'} <= set(datasets)
    assert all((root / d['path']).exists() for d in datasets.values())


def fixtures_seen(env: dict) -> str:
    """Where tests/conftest.py finds the fixtures under ``env`` (a new interpreter)."""
    done = subprocess.run([sys.executable, '-c', 'from tests.conftest import FIXTURES; '
                           'print(FIXTURES)'], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_tests_read_the_fixtures_in_the_repository_unless_told_otherwise():
    env = {k: v for k, v in os.environ.items() if k != 'LOADR_FIXTURES'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')])
    assert fixtures_seen(env) == str(IN_REPO)
    assert fixtures_seen({**env, 'LOADR_FIXTURES': ''}) == str(IN_REPO)
    assert fixtures_seen({**env, 'LOADR_FIXTURES': '/elsewhere/fixtures'}) == '/elsewhere/fixtures'
