"""Whole runs (a Loader and its workers) against servers that lack something: one that
ignores ``Range``, and S3 presigned URLs that expire while the run reads."""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import time

import pytest

import loadr

from ..loader_helpers import batch_digest, stream_digests
from .proxy import Proxy
from .servers import start_plain_http, upload

pytestmark = pytest.mark.timeout(180)
FAST = {'backoff_s': 0.005, 'backoff_max_s': 0.05}
RECORDS, RECORD_BYTES, BATCH, BATCHES = 64, 20_000, 8, 4
EXPIRE_S = 2.0          # a presigned URL's life, shortened (S3's are up to 7 days)


def _write_dataset(path) -> None:
    """A bag of one shard: RECORDS records of RECORD_BYTES (a value file of ~1.3 MB)."""
    from loadr.writers import BagWriter
    with BagWriter(path, {'v': 'bytes', 'n': 'int'}, shardlen=RECORDS) as w:
        for i in range(RECORDS):
            w.append({'v': i.to_bytes(4, 'little') * (RECORD_BYTES // 4), 'n': i})


def _stream(reader, workers: int, batches: int = BATCHES) -> list:
    with loadr.Loader(reader, batch=BATCH, seed=3, workers=workers) as loader:
        return stream_digests(loader, batches)


@contextlib.contextmanager
def _logged(path):
    """The 'loadr' log of this process and of its forked workers, written to ``path``."""
    handler = logging.FileHandler(path)
    logger = logging.getLogger('loadr')
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize('start_method', ['fork', 'spawn'])
def test_a_loader_over_a_server_that_ignores_range_reads_each_file_whole_once(
        tmp_path, capfd, start_method):
    """python's http.server answers every range request with the whole file. A Loader
    with 2 workers used to send a whole-file GET for about every record (131 for 4
    batches of one 19 MB shard) and its stats advised hundreds more workers: each file
    is now read whole at most once per process (3 here), one warning says that the
    server ignores Range and what it costs, the batches are the local ones, and the
    verdict never asks for more workers. Forked workers keep what their parent read
    whole; spawned ones read each file themselves."""
    _write_dataset(tmp_path / 'site' / 'ds')
    expected = _stream(loadr.open(tmp_path / 'site' / 'ds'), workers=0)
    files = [p for p in (tmp_path / 'site' / 'ds').rglob('*') if p.is_file()]
    log = tmp_path / 'log'
    with start_plain_http(tmp_path / 'site') as web, _logged(log):
        reader = loadr.open(f'{web.url}/ds', storage_options={'loadr': FAST})
        with loadr.Loader(reader, batch=BATCH, seed=3, workers=2,
                          start_method=start_method) as loader:
            assert stream_digests(loader, BATCHES) == expected
            stats = loader.stats()
        gets = collections.Counter(path for method, path, _ in web.log
                                   if method == 'GET' and not path.endswith('/'))
    assert set(gets) <= {f'/ds/{p.relative_to(tmp_path / "site" / "ds").as_posix()}'
                         for p in files}, gets
    assert sum(gets.values()) <= 3 * len(files), gets          # processes x files
    assert max(gets.values()) <= 3, gets
    lines = [line for line in log.read_text().splitlines() + capfd.readouterr().err.splitlines()
             if 'ignores Range' in line]
    assert len(lines) == 1, lines
    assert web.url in lines[0] and 'whole' in lines[0], lines
    verdict = stats.verdict()
    assert not re.search(r'\d+ more workers? would help|workers=\d+ would help', verdict), \
        verdict
    assert 'ignores Range' in verdict or verdict.startswith('not the bottleneck'), verdict
    assert stats.as_dict()['remote']['whole_reads'] > 0
    # A later loader of this process (workers=0: its counters are this process's) over
    # local files is told nothing of that server.
    with loadr.Loader(loadr.open(tmp_path / 'site' / 'ds'), batch=BATCH, workers=0) as loader:
        stream_digests(loader, 1)
        assert not (loader.stats().as_dict()['remote'] or {}).get('whole_reads')


def test_presigned_urls_that_expire_mid_run_are_signed_again(moto, tmp_path):
    """S3 refuses a presigned URL past its expiry: 403 AccessDenied "Request has
    expired". Here URLs expire EXPIRE_S after they were signed (the proxy refuses
    them, as S3 would), so the URLs the workers signed expire while they read: each
    is signed again, and the run goes on with the same batches as the local run."""
    name = f'expiring-{id(tmp_path)}'
    _write_dataset(tmp_path / name)
    upload(moto.url, 'fixtures', tmp_path / name, name)
    with Proxy(moto.url, expire_after_s=EXPIRE_S) as proxy:
        remote = loadr.open(f's3://fixtures/{name}', storage_options={
            'endpoint_url': proxy.url, 'loadr': {**FAST, 'small_file_bytes': 0}})
        with loadr.Loader(loadr.open(tmp_path / name), batch=BATCH, seed=3,
                          workers=0) as here, \
                loadr.Loader(remote, batch=BATCH, seed=3, workers=2) as there:
            local, batches = iter(here), iter(there)
            deadline = time.monotonic() + 60
            after = 0               # batches compared since the first URL was refused
            while after < 2 * RECORDS // BATCH:        # two epochs: all of it read again
                assert batch_digest(next(batches)) == batch_digest(next(local)), after
                if proxy.stats['expired']:
                    after += 1
                else:
                    time.sleep(0.05)        # the URLs age while the workers read ahead
                assert time.monotonic() < deadline, proxy.stats
        assert proxy.stats['expired'] > 0, proxy.stats
