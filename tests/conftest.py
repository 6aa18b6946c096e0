"""Shared test fixtures: the reference datasets and their manifest.

The reference fixtures live in ``../shared/fixtures`` beside the checkout
(CI has it there too); they are read in place, never copied into the repo.
A clone without them still runs the suite: every test that needs them asks
for the ``fixtures`` fixture (or calls :func:`require_fixtures`), which skips
with one line saying how to get them, or fails when ``CI=true`` (CI must not
pass by skipping). Everything else writes its own data (``tests/datasets.py``).
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
FIXTURES = pathlib.Path(os.environ.get('LOADR_FIXTURES', ROOT.parent / 'shared' / 'fixtures'))
HOW_TO_GET = ('put the loadr reference fixtures (the shared fixtures set, with its MANIFEST.json) '
              'at ../shared/fixtures beside the checkout, or set LOADR_FIXTURES=/path/to/them')


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
    from .datasets import write_bag, write_bag_sharded, write_ffrecord, write_ffrecord_multi, \
        write_gulp
    root = tmp_path_factory.mktemp('local_data')
    write_bag(root / 'bag')
    write_bag_sharded(root / 'bag_sharded')
    write_gulp(root / 'gulp')
    (root / 'ffrecord').mkdir()
    write_ffrecord(root / 'ffrecord' / 'single.ffr')
    write_ffrecord_multi(root / 'ffrecord' / 'multi')
    return root
