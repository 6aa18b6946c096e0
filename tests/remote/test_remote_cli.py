"""URLs wherever a path works: YAML pipelines, loadr.check, and the command line."""

from __future__ import annotations

import json

import pytest

import loadr
import loadr.config
from loadr.cli import main

from ..loader_helpers import stream_digests
from ..readers.common import assert_equal
from .servers import upload

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


def test_cli_check_writes_and_checks_the_digests_of_a_dataset_in_a_bucket(moto, served_root,
                                                                         capsys):
    # The command's options reach the check, the layout of the files and the sidecar's write.
    from loadr.check import DIGESTS
    upload(moto.url, 'fixtures', served_root / 'gulp', prefix='digested/gulp')
    url = 's3://fixtures/digested/gulp'
    opt = ['--storage-option', f'endpoint_url={moto.url}']
    assert main(['check', '--write-digests', url, *opt]) == 0
    assert f'wrote digests of every file and record to {url}' in capsys.readouterr().out
    report = loadr.check(url, storage_options={'endpoint_url': moto.url})
    assert report.ok and DIGESTS in report.checksums, report


def test_cli_errors_are_one_line(moto, capsys):
    pytest.importorskip('fsspec')
    try:
        import gcsfs  # noqa: F401
        pytest.skip('gcsfs is installed here: no missing package to report')
    except ImportError:
        pass
    assert main(['inspect', 'gs://bucket/data.ffr']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install fsspec gcsfs" in err[0], err
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


def test_cli_inspect_of_a_url_reports_the_size_and_files_read(nginx, served_root, capsys):
    identity = loadr.open(served_root / 'bag_sharded').identity()
    size, count = identity.get('bytes'), identity.get('file_count')
    if 'files' in identity:
        size, count = sum(identity['files'].values()), len(identity['files'])
    assert main(['inspect', f'{nginx.url}/bag_sharded', '--json']) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown['size_bytes'], shown['files']) == (size, count) and count > 1
    assert main(['inspect', f'{nginx.url}/ffrecord/single.ffr']) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "in 1 file(s)" in first and ' 0 B ' not in first, first


def _mix_yaml(tmp_path, sources: dict):
    config = tmp_path / 'mix.yaml'
    config.write_text(json.dumps({'reader': {'mix': sources}}))
    return str(config)


def test_storage_option_is_merged_with_the_cache_settings_of_a_yaml_reader(moto, tmp_path,
                                                                           capsys):
    config = _mix_yaml(tmp_path, {
        'a': {'path': 's3://fixtures/bag', 'weight': 1, 'cache_dir': str(tmp_path / 'c'),
              'cache_bytes': 10_000},
        'b': {'path': 's3://fixtures/gulp', 'weight': 1,
              'storage_options': {'loadr': {'timeout_s': 30}}}})
    opt = ['--storage-option', f'endpoint_url={moto.url}', '--storage-option', 'loadr.retries=0']
    assert main(['inspect', config, *opt]) == 0, capsys.readouterr().err
    # Under the same command options, the reader of source a keeps the endpoint and the cache.
    config = loadr.config.load_config({'reader': {'path': 's3://fixtures/bag', 'cache_dir':
                                                  str(tmp_path / 'c'), 'cache_bytes': 10_000},
                                       'loader': {'batch': 2, 'workers': 0}},
                                      storage_options={'endpoint_url': moto.url})
    with config.build() as loader:
        storage = loader.reader._files
    assert storage.options['endpoint_url'] == moto.url
    assert storage.settings.cache_bytes == 10_000
    # A reader's own storage_options are merged over them too, key by key, its own winning.
    config = loadr.config.load_config(
        {'reader': {'path': 's3://fixtures/gulp', 'storage_options': {'loadr': {'timeout_s': 30}}}},
        storage_options={'endpoint_url': moto.url, 'loadr': {'retries': 1, 'timeout_s': 9}})
    storage = config.build_reader()._files
    assert storage.options['endpoint_url'] == moto.url
    assert (storage.settings.retries, storage.settings.timeout_s) == (1, 30)


def test_an_unreachable_server_is_not_reported_as_missing(moto, capsys):
    from .servers import free_port
    dead = f'http://127.0.0.1:{free_port()}'
    quick = {'retries': 1, 'backoff_s': 0.01, 'timeout_s': 5}
    for url, options in [('s3://fixtures/bag', {'endpoint_url': dead, 'loadr': quick}),
                         (f'{dead}/bag', {'loadr': quick})]:
        with pytest.raises(loadr.errors.ConfigError) as err:
            loadr.pipeline({**PIPELINE, 'reader': {'path': url, 'storage_options': options}})
        text = str(err.value)
        assert 'cannot be reached' in text and 'does not exist' not in text, text
        assert 'Connect' in text, text                  # the cause: connection refused
        if url.startswith('s3'):
            continue                    # botocore takes ~2 s to give up: once is enough
        with pytest.raises(loadr.errors.ReadError, match='cannot be reached.*Connect'):
            loadr.open(url, storage_options=options)
        report = loadr.check(url, storage_options=options)
        assert not report.ok and 'cannot be reached' in report.problems[0].message
    assert main(['inspect', f'{dead}/bag', '--storage-option', 'loadr.retries=0']) == 1
    line = capsys.readouterr().err.strip()
    assert 'no such' not in line and 'Connect' in line, line


def test_agents_read_a_bucket_with_the_command_s_storage_options(moto, served_root):
    """`loadr run pipeline.yaml --storage-option endpoint_url=...` with remote agents: the
    option is the command's, in no mapping, and the agents rebuild the reader with it too
    (they read the bucket at moto's endpoint, as the trainer does)."""
    local = loadr.pipeline({**PIPELINE, 'reader': {'path': str(served_root / 'bag_sharded'),
                                                   'decode_images': False}})
    with local:
        expected = stream_digests(local, 3)
    remote = {**PIPELINE['loader'], 'remote': {'engine': 'subprocesses', 'agents': 1}}
    config = loadr.config.load_config(
        {**PIPELINE, 'loader': remote,
         'reader': {'path': 's3://fixtures/bag_sharded', 'decode_images': False}},
        storage_options={'endpoint_url': moto.url, 'loadr': {'retries': 1}})
    with config.build() as loader:
        assert loader.recipe[3] == {'endpoint_url': moto.url, 'loadr': {'retries': 1}}
        assert stream_digests(loader, 3) == expected
        assert loader.stats().agents, 'the batches came from no agent'
