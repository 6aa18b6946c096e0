"""URLs wherever a path works: YAML pipelines, loadr.check, and the command line."""

from __future__ import annotations

import json

import pytest

import loadr
import loadr.remote
from loadr.cli import main

from ..loader_helpers import stream_digests
from ..readers.common import assert_equal

pytestmark = pytest.mark.timeout(120)

PIPELINE = {'loader': {'batch': 4, 'seed': 5, 'workers': 0},
            'fns': [{'select': {'keys': ['image', 'idx']}},
                    {'decode_jpeg': {'key': 'image', 'size': [16, 16]}}]}


def test_yaml_reader_with_a_url_and_storage_options(moto, nginx, served_root):
    local = loadr.pipeline({**PIPELINE, 'reader': {'path': str(served_root / 'bag_sharded'),
                                                   'decode_images': False}})
    with local:
        expected = stream_digests(local, 3)
    for reader in [{'path': f'{nginx.url}/bag_sharded'},
                   {'path': 's3://fixtures/bag_sharded',
                    'storage_options': {'endpoint_url': moto.url, 'loadr': {'retries': 2}}}]:
        with loadr.pipeline({**PIPELINE, 'reader': {**reader, 'decode_images': False}}) as loader:
            assert stream_digests(loader, 3) == expected


def test_yaml_url_that_does_not_exist(nginx):
    with pytest.raises(loadr.errors.ConfigError, match='does not exist'):
        loadr.pipeline({**PIPELINE, 'reader': {'path': f'{nginx.url}/nothing'}})


def test_check_over_urls(moto, nginx):
    assert loadr.check(f'{nginx.url}/gulp').ok
    report = loadr.check('s3://fixtures/ffrecord/multi', storage_options={'endpoint_url': moto.url})
    assert report.ok and report.format == 'ffrecord'
    report = loadr.check('s3://fixtures/nothing', storage_options={'endpoint_url': moto.url})
    assert not report.ok


def test_cli_inspect_check_and_convert_with_storage_options(moto, served_root, tmp_path, capsys):
    opt = ['--storage-option', f'endpoint_url={moto.url}', '--storage-option', 'loadr.retries=2']
    assert main(['inspect', 's3://fixtures/ffrecord/single.ffr', '--json', *opt]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown['format'] == 'ffrecord' and shown['datapoints'] == 20
    assert main(['check', 's3://fixtures/gulp', *opt]) == 0
    capsys.readouterr()
    assert main(['convert', str(served_root / 'bag'), 's3://fixtures/cli/bag', '--to', 'bag',
                 *opt]) == 0
    there = loadr.open('s3://fixtures/cli/bag', storage_options={'endpoint_url': moto.url})
    here = loadr.open(served_root / 'bag')
    there.prefetch(range(len(there)))
    for i in range(len(here)):
        assert_equal(there[i], here[i], f'bag[{i}]')


def test_cli_errors_are_one_line(moto, capsys):
    pytest.importorskip('fsspec')
    try:
        import gcsfs  # noqa: F401
        pytest.skip('gcsfs is installed here: no missing package to report')
    except ImportError:
        pass
    assert main(['inspect', 'gs://bucket/data.ffr']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'loadr[gcs]'" in err[0], err
    assert main(['inspect', 's3://fixtures/nothing.ffr',
                 '--storage-option', f'endpoint_url={moto.url}']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 's3://fixtures/nothing.ffr' in err[0], err
    assert 'Traceback' not in '\n'.join(err) and 'botocore' not in '\n'.join(err)
    assert main(['inspect', 's3://x/y', '--storage-option', 'novalue']) == 2
    assert 'KEY=VALUE' in capsys.readouterr().err


def test_cli_takes_the_endpoint_from_the_environment(moto, monkeypatch, capsys):
    """AWS_ENDPOINT_URL (the standard variable, read by botocore) with no option at all."""
    monkeypatch.setenv('AWS_ENDPOINT_URL', moto.url)
    assert main(['inspect', 's3://fixtures/ffrecord/single.ffr', '--json']) == 0
    assert json.loads(capsys.readouterr().out)['format'] == 'ffrecord'
