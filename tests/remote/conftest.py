"""Session fixtures: nginx and moto's S3 server on loopback, serving a copy of the fixtures.

Both servers start once per session (the first test that asks) and stop at
its end; nothing is left running. Where a server cannot be installed the
tests that need it skip with one line saying what to install; under CI
(``CI=true``) they fail instead, since CI installs both (``.ci/run``).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from ..conftest import require_fixtures
from .proxy import Proxy
from .servers import S3_ENV, ServerUnavailable, in_ci, start_moto, start_nginx, upload

BUCKET = 'fixtures'


def _unavailable(reason: str):
    if in_ci():
        pytest.fail(f'{reason} (CI=true: the remote tests must run)', pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope='session')
def served_root(tmp_path_factory) -> pathlib.Path:
    """A private copy of the reference fixtures, which the servers serve."""
    # Missing fixtures skip (fail under CI) with the one line every fixture test gives.
    fixtures = require_fixtures()
    root = tmp_path_factory.mktemp('served') / 'fixtures'
    shutil.copytree(fixtures, root)
    return root


@pytest.fixture(scope='session')
def nginx(served_root, tmp_path_factory):
    """nginx serving ``served_root`` at ``nginx.url`` (``/<fixture path>``)."""
    try:
        server = start_nginx(served_root, tmp_path_factory.mktemp('nginx'))
    except ServerUnavailable as exc:
        _unavailable(str(exc))
    with server:
        yield server


@pytest.fixture(scope='session')
def s3_env():
    """The fake credentials moto accepts, in the environment for this session."""
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    yield S3_ENV
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope='session')
def moto(served_root, tmp_path_factory, s3_env):
    """moto's S3 server at ``moto.url`` with the fixtures in ``s3://fixtures/``."""
    try:
        server = start_moto(tmp_path_factory.mktemp('moto'))
    except ServerUnavailable as exc:
        _unavailable(str(exc))
    with server:
        upload(server.url, BUCKET, served_root)
        yield server


@pytest.fixture(scope='session')
def moto_auth(tmp_path_factory, s3_env):
    """A second moto S3 server that checks credentials (and knows none of ours)."""
    try:
        server = start_moto(tmp_path_factory.mktemp('moto_auth'), auth=True)
    except ServerUnavailable as exc:
        _unavailable(str(exc))
    with server:
        yield server


@pytest.fixture
def proxy(nginx):
    """A fault-injecting proxy in front of nginx; a test sets its faults."""
    with Proxy(nginx.url) as p:
        yield p
