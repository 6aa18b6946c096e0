"""The formats users already have, over HTTP (nginx) and S3 (moto): what local reads give."""

from __future__ import annotations

import os
import shutil

import pytest

import loadr
from loadr.readers.webdataset.index import SIDECAR_SUFFIX

from ..readers.common import assert_equal
from ..readers.test_parquet import rows as parquet_rows
from ..readers.test_webdataset import jpeg, write_shards
from .servers import upload

pytestmark = pytest.mark.timeout(120)
pytest.importorskip('webdataset')
try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:          # the Parquet test skips
    pa = pq = None


@pytest.fixture(scope='module')
def wds_root(served_root):
    """Shards with sidecars (``indexed``) and without (``bare``), served by nginx and moto."""
    root = served_root / 'wds_formats'
    if not root.exists():
        write_shards(root / 'indexed', shards=3, per=5)
        write_shards(root / 'bare', shards=2, per=4)
        loadr.open(root / 'indexed')                   # writes the sidecars
        if pq is not None:
            (root / 'parquet').mkdir()
            for k, (first, n) in enumerate([(0, 9), (9, 6)]):
                pq.write_table(pa.Table.from_pylist(parquet_rows(first, n)),
                               root / 'parquet' / f'part-{k}.parquet', row_group_size=4)
        for k in range(5):
            folder = root / 'photos' / ('cat', 'dog')[k % 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f'{k}.jpg').write_bytes(jpeg(k))
    return root


@pytest.fixture(params=['http', 's3'])
def remote(request, wds_root):
    if request.param == 'http':
        return request.getfixturevalue('nginx').url, {}
    moto = request.getfixturevalue('moto')
    upload(moto.url, 'fixtures', wds_root, prefix='wds_formats')
    return 's3://fixtures', {'endpoint_url': moto.url}


@pytest.mark.parametrize('name,pattern', [('indexed', 'train-{000000..000002}.tar'),
                                          ('bare', 'train-{000000..000001}.tar')])
def test_shards_over_urls_read_as_local(remote, wds_root, name, pattern):
    base, options = remote
    here = loadr.open(str(wds_root / name / pattern), write_index=False)
    for there in (loadr.open(f'{base}/wds_formats/{name}/{pattern}', storage_options=options),
                  loadr.open(f'{base}/wds_formats/{name}', storage_options=options)):
        assert len(there) == len(here) and there.identity() == here.identity()
        for i in range(len(here)):
            assert_equal(there[i], here[i], f'{name}[{i}]')
        order = list(range(len(here)))[::-1]
        for i, dp in zip(order, there.read_batch(order)):
            assert_equal(dp, here[i])
        # With a sidecar beside the tar it is read; without, the headers are (and the
        # index travels with the reader to the workers).
        assert all(s.shipped == (name == 'bare') for s in there._shards)


def test_a_url_without_sidecars_is_never_written_to(nginx, wds_root):
    before = sorted(os.listdir(wds_root / 'bare'))
    r = loadr.open(f'{nginx.url}/wds_formats/bare')
    assert len(r) == 8 and sorted(os.listdir(wds_root / 'bare')) == before
    assert not any(n.endswith(SIDECAR_SUFFIX) for n in before)


def test_check_over_http(nginx, wds_root, tmp_path):
    assert loadr.check(f'{nginx.url}/wds_formats/indexed').ok
    # A stale sidecar (of another tar) is reported, naming it.
    stale = wds_root / 'stale'
    if not stale.exists():
        shutil.copytree(wds_root / 'indexed', stale)
        shutil.copy(stale / f'train-000001.tar{SIDECAR_SUFFIX}',
                    stale / f'train-000000.tar{SIDECAR_SUFFIX}')
    report = loadr.check(f'{nginx.url}/wds_formats/stale')
    assert not report.ok and SIDECAR_SUFFIX in report.problems[0].path


@pytest.mark.parametrize('name,options', [('parquet', {}), ('parquet/*.parquet', {}),
                                          ('parquet', {'columns': ['label', 'image']}),
                                          ('photos', {})])
def test_parquet_and_image_folders_over_urls_read_as_local(remote, wds_root, name, options):
    if name.startswith('parquet') and pq is None:
        pytest.skip('pyarrow is not installed')
    base, storage_options = remote
    here = loadr.open(str(wds_root / name), **options)
    there = loadr.open(f'{base}/wds_formats/{name}', storage_options=storage_options, **options)
    assert type(there) is type(here) and len(there) == len(here)
    for i in range(len(here)):
        assert_equal(there[i], here[i], f'{name}[{i}]')
    order = list(range(len(here)))[::-1]
    for i, dp in zip(order, there.read_batch(order)):
        assert_equal(dp, here[i])


def test_loadr_index_writes_sidecars_into_a_bucket(moto, wds_root, capsys):
    from loadr.cli import main
    upload(moto.url, 'fixtures', wds_root / 'bare', prefix='wds_index')
    url = 's3://fixtures/wds_index'
    option = f'endpoint_url={moto.url}'
    assert main(['index', url, '--storage-option', option]) == 0
    assert '2 sidecar(s) beside the tars' in capsys.readouterr().out
    r = loadr.open(url, storage_options={'endpoint_url': moto.url})
    assert not any(s.shipped for s in r._shards)           # read from the bucket now
    here = loadr.open(wds_root / 'bare', write_index=False)
    for i in range(len(here)):
        assert_equal(r[i], here[i])


def test_a_tar_behind_a_url_is_read_only_as_its_index_says(nginx, served_root):
    """Replaced at its URL between open and read: by another version (refused by the version
    the reader opened), or by one of the same size and time (nginx's ETag and Last-Modified
    alike: the member headers tell). A sidecar older than its tar is not used."""
    from ..readers.test_webdataset_faults import ORDER, REORDERED, member_values, write_tar
    root = served_root / 'wds_replaced'
    root.mkdir()
    tar = root / 'a.tar'
    url = f'{nginx.url}/wds_replaced/a.tar'
    write_tar(tar, ORDER)
    loadr.open(tar)                                   # its sidecar, beside it
    stamp = os.stat(tar)
    # Another version (a new Last-Modified and ETag): the range requests ask for the one opened.
    r = loadr.open(url)
    write_tar(tar, REORDERED)
    os.utime(tar, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    with pytest.raises(loadr.errors.ReadError, match='changed since the reader was made') as err:
        r[2]
    assert err.value.path == url and err.value.index == 2
    # The sidecar is now older than its tar: a reader made now indexes the tar itself.
    fresh = loadr.open(url)
    assert fresh._shards[0].shipped
    for k in range(4):
        want = member_values(k)
        got = fresh[k]
        assert (got['cls'], got['id'], got['a.bin']) == (int(want['cls']), int(want['id']),
                                                         want['a.bin'])
    # The same size and time again: nothing the server says tells; each header does.
    write_tar(tar, ORDER)
    os.utime(tar, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    for mask in (None, {'cls': True}, {'b.bin': True}):
        with pytest.raises(loadr.errors.FormatError, match='does not match the tar') as err:
            fresh[1] if mask is None else fresh[1, mask]
        assert err.value.path == url and err.value.index == 1
        assert 'open the dataset again' in str(err.value)
