"""Shared test fixtures: the reference datasets and their manifest.

The reference fixtures live in ``../shared/fixtures`` beside the checkout
(CI has it there too); they are read in place, never copied into the repo.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(os.environ.get('LOADR_FIXTURES', ROOT.parent / 'shared' / 'fixtures'))


@pytest.fixture(scope='session')
def fixtures() -> pathlib.Path:
    if not (FIXTURES / 'MANIFEST.json').exists():
        pytest.fail(f'reference fixtures not found at {FIXTURES} (set LOADR_FIXTURES)')
    return FIXTURES


@pytest.fixture(scope='session')
def manifest(fixtures) -> dict:
    return json.loads((fixtures / 'MANIFEST.json').read_text())
