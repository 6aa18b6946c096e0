"""The suite with the reference fixtures missing (LOADR_FIXTURES naming nothing).

Tests that need the reference fixtures skip with one line saying how to get
them (under CI=true they fail instead); the rest run on data they write; no
run leaves folders behind in the temp directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

from .conftest import HOW_TO_GET, ROOT

TIMEOUT_S = 300
# Files that need the fixtures (and copied them into /tmp/loadr-bad-* even when absent),
# and a test that needs only data it writes.
NEEDS_FIXTURES = 'tests/fuzz/test_bad_files.py'
LOCAL = 'tests/test_loader_readers.py::test_resume_over_a_real_reader'
# A docstring example that reads the fixtures (loadr/check.py has only that one).
DOCTEST = 'loadr/check.py'
# Remote tests: their servers serve a copy of the fixtures.
REMOTE = 'tests/remote/test_remote_storage.py'


def run_pytest(tmp_path, *args, ci: bool = False,
               cwd=ROOT) -> tuple[subprocess.CompletedProcess, list]:
    """pytest in a child with the fixtures absent and its own TMPDIR; (result, what it left).

    ``args`` are paths relative to the checkout, wherever the child runs (``cwd``).
    """
    # A short TMPDIR: the workers' socket paths under it must fit in 107 bytes.
    tmp = tempfile.mkdtemp(prefix='loadr-nofix-')
    try:
        env = {k: v for k, v in os.environ.items() if k != 'CI'}
        env.update(LOADR_FIXTURES=str(tmp_path / 'no-fixtures'), TMPDIR=tmp)
        if ci:
            env['CI'] = 'true'
        # In one process (a few files: workers would cost more than they save), and every
        # test of the files asked for, those marked slow too.
        done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-ra', '-p',
                               'no:cacheprovider', '--numprocesses=0', '-m', '',
                               '--basetemp', str(tmp_path / 'basetemp'),
                               *(str(ROOT / a) for a in args)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        return done, sorted(os.listdir(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def counts(output: str) -> dict:
    last = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r'(\d+) (passed|skipped|failed|errors?)', last)}


def test_without_fixtures_the_tests_that_need_them_skip_with_one_line(tmp_path):
    done, left = run_pytest(tmp_path, NEEDS_FIXTURES, LOCAL)
    assert done.returncode == 0, done.stdout[-3000:]
    got = counts(done.stdout)
    assert got.get('skipped', 0) >= 20 and got.get('passed') == 1, got
    assert 'error' not in got and 'errors' not in got and 'failed' not in got, got
    skip_lines = [line for line in done.stdout.splitlines() if line.startswith('SKIPPED')]
    assert len(skip_lines) == 1 and HOW_TO_GET in skip_lines[0], skip_lines
    assert 'LOADR_FIXTURES' in skip_lines[0]
    assert left == [], left                  # no /tmp/loadr-bad-* (or anything) left behind


def test_under_ci_a_missing_fixture_is_a_failure(tmp_path):
    done, left = run_pytest(tmp_path, NEEDS_FIXTURES, LOCAL, ci=True)
    assert done.returncode == 1
    got = counts(done.stdout)
    assert got.get('skipped', 0) == 0 and got.get('passed') == 1, got
    assert got.get('failed', 0) + got.get('errors', got.get('error', 0)) >= 20, got
    assert 'CI=true: a missing fixture is a failure' in done.stdout
    assert left == [], left


def test_without_fixtures_the_doctests_that_read_them_skip_with_the_same_line(tmp_path):
    # From a working directory with nothing beside it: an example's fixture path must not
    # depend on where pytest runs (they named '../shared/fixtures/...' and failed there).
    # The remote tests' servers skip with the same line too (they had a line of their own).
    where = tmp_path / 'elsewhere'
    where.mkdir()
    done, left = run_pytest(tmp_path, NEEDS_FIXTURES, DOCTEST, REMOTE, cwd=where)
    assert done.returncode == 0, done.stdout[-3000:]
    got = counts(done.stdout)
    assert got.get('skipped', 0) >= 21 and 'failed' not in got, got
    assert 'error' not in got and 'errors' not in got, got
    skip_lines = [line for line in done.stdout.splitlines() if line.startswith('SKIPPED')]
    assert len(skip_lines) == 1 and HOW_TO_GET in skip_lines[0], skip_lines
    assert left == [], left


def test_under_ci_a_doctest_that_reads_a_missing_fixture_fails(tmp_path):
    where = tmp_path / 'elsewhere'
    where.mkdir()
    done, left = run_pytest(tmp_path, DOCTEST, ci=True, cwd=where)
    assert done.returncode == 1, done.stdout[-3000:]
    got = counts(done.stdout)
    assert got.get('skipped', 0) == 0 and got.get('passed', 0) == 0, got
    assert 'CI=true: a missing fixture is a failure' in done.stdout
