"""Shared test fixtures: the reference datasets and their manifest.

The reference fixtures are in the repository, in ``tests/fixtures`` (1.4 MB):
small datasets written once by the original libraries (gulpio2, granular,
ffrecord), with ``MANIFEST.json`` (every file's size and sha256, and what
each holds) and ``README.md`` (how they were made; ``synth.py`` rebuilds
their pixels). The files are kept byte-equal to the MANIFEST
(``tests/test_fixtures.py``); ``LOADR_FIXTURES=/path`` reads another copy.
Should they be missing (a sparse checkout, a wrong ``LOADR_FIXTURES``),
every test that needs them asks for the ``fixtures`` fixture (or calls
:func:`require_fixtures`), which skips with one line saying where they come
from, or fails when ``CI=true`` (CI must not pass by skipping). Everything
else writes its own data (``tests/datasets.py``).
The docstring examples of loadr/ get the same path as ``FIXTURES`` and the
same skip, and ``-ra`` folds every such skip into one line: both in the
checkout's root conftest.py.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
IN_REPO = ROOT / 'tests' / 'fixtures'
FIXTURES = pathlib.Path(os.environ.get('LOADR_FIXTURES') or IN_REPO)
HOW_TO_GET = ('the loadr reference fixtures come with the repository, in tests/fixtures (with '
              'their MANIFEST.json; `git checkout -- tests/fixtures` restores them): unset '
              'LOADR_FIXTURES to read those, or set it to another copy of them')
# Data, not tests: synth.py is the fixtures' own (not collected for its doctests either).
collect_ignore = ['fixtures']


def in_ci() -> bool:
    """True under CI (``CI=true``, as GitHub Actions, GitLab and most others set it)."""
    return os.environ.get('CI', '').strip().lower() in ('true', '1', 'yes')


def require_fixtures() -> pathlib.Path:
    """FIXTURES, or skip the calling test (fail it under CI) when they are not there."""
    if not (FIXTURES / 'MANIFEST.json').is_file():
        reason = f'reference fixtures not found at {FIXTURES}: {HOW_TO_GET}'
        if in_ci():
            pytest.fail(f'{reason} (CI=true: a missing fixture is a failure)', pytrace=False)
        pytest.skip(reason)
    return FIXTURES


@pytest.fixture(scope='session')
def fixtures() -> pathlib.Path:
    return require_fixtures()


@pytest.fixture(scope='session')
def manifest(fixtures) -> dict:
    return json.loads((fixtures / 'MANIFEST.json').read_text())


@pytest.fixture(scope='session')
def local_data(tmp_path_factory) -> pathlib.Path:
    """Datasets written here, laid out like the fixtures (bag, bag_sharded, gulp, ffrecord/...).

    For the tests that need *a* dataset of each format, not the reference one.
    """
    from .datasets import (
        write_bag,
        write_bag_sharded,
        write_ffrecord,
        write_ffrecord_multi,
        write_gulp,
    )
    root = tmp_path_factory.mktemp('local_data')
    write_bag(root / 'bag')
    write_bag_sharded(root / 'bag_sharded')
    write_gulp(root / 'gulp')
    (root / 'ffrecord').mkdir()
    write_ffrecord(root / 'ffrecord' / 'single.ffr')
    write_ffrecord_multi(root / 'ffrecord' / 'multi')
    return root
