"""pytest's doctest collection of loadr/, and the one line for missing fixtures.

``--doctest-modules`` imports every module of loadr/ to find its examples.
``loadr/__main__.py`` runs the command when imported, and the adapters
(``loadr.torch``, a package, and ``loadr.jax``) import optional packages: those are
left out when the package is not installed (their own tests skip then too).

An example that reads the reference fixtures names their directory
``FIXTURES`` (a :class:`pathlib.Path`), given to the doctest namespace here:
it is found wherever the suite runs from (``tests/fixtures`` in the
repository, or ``LOADR_FIXTURES``, as for the tests), and without
the fixtures the example skips with the tests' one line (a failure under
``CI=true``), instead of failing on a path relative to the working directory.
"""

from __future__ import annotations

import importlib.util
import os
import signal

import pytest

from tests.conftest import HOW_TO_GET, require_fixtures

collect_ignore = ['loadr/__main__.py']
for _module, _needs in (('loadr/torch', 'torch'), ('loadr/jax.py', 'jax')):
    if importlib.util.find_spec(_needs) is None:
        collect_ignore.append(_module)
# JAX starts threads when it initialises, and this process forks loader workers in
# later tests (forking a multithreaded process can deadlock): loadr/jax.py's examples
# run in a child pytest started by tests/test_jax.py, which sets LOADR_JAX_DOCTESTS.
if not os.environ.get('LOADR_JAX_DOCTESTS') and 'loadr/jax.py' not in collect_ignore:
    collect_ignore.append('loadr/jax.py')


@pytest.fixture(autouse=True)
def _fixtures_in_doctests(request):
    # Only the doctests that name FIXTURES need (and wait for) the fixtures.
    test = getattr(request.node, 'dtest', None)
    if test is not None and any('FIXTURES' in example.source for example in test.examples):
        request.getfixturevalue('doctest_namespace')['FIXTURES'] = require_fixtures()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Every skip for missing fixtures (tests and doctests) is reported at one place,
    # so that `-ra` folds them into a single line instead of one per file and line.
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and HOW_TO_GET in str(
            report.longrepr[2]):
        report.longrepr = (_SKIP_AT.co_filename, _SKIP_AT.co_firstlineno, report.longrepr[2])


_SKIP_AT = require_fixtures.__code__


def pytest_addoption(parser):
    # pyproject's addopts runs the suite on pytest-xdist's workers (`-n`): it waits on
    # processes and servers far more than it computes. Without pytest-xdist (an install
    # without the 'test' extra) `--numprocesses` is accepted and the run is serial.
    if importlib.util.find_spec('xdist') is None:
        parser.addoption('--numprocesses', dest='numprocesses', default=None,
                         help='worker processes (ignored: pytest-xdist is not installed)')


def pytest_configure(config):
    # pytest-xdist's workers start with SIGINT ignored (execnet does it), and a child
    # process inherits an ignored signal across exec: its Python then installs no
    # KeyboardInterrupt handler, and a test that presses Ctrl-C on a child (test_cli,
    # tests/faults) waits on a child that cannot be interrupted. A worker gets back the
    # handler a plain pytest run has.
    if hasattr(config, 'workerinput') and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
