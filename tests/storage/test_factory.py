"""loadr.storage's factory: the class of each protocol, and storages shared within one open.

No server: making a remote storage opens nothing (fsspec's filesystem is
made on first use), so these run without the network.
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from loadr.errors import ConfigError
from loadr.storage import LocalStorage, remote_storage, settings_for, storage_class, storage_for

pytest.importorskip('fsspec')
pytest.importorskip('aiohttp')
pytest.importorskip('s3fs')


def test_each_protocol_gets_its_subclass_of_the_remote_storage():
    from loadr.storage.http import HTTPStorage
    from loadr.storage.remote import RemoteStorage
    from loadr.storage.s3 import S3Storage
    assert storage_class('https://h/x') is HTTPStorage
    assert storage_class('HTTP://h/x') is HTTPStorage
    assert storage_class('s3a://b/x') is S3Storage
    assert storage_class('memory://x') is RemoteStorage
    assert issubclass(HTTPStorage, RemoteStorage) and issubclass(S3Storage, RemoteStorage)
    assert type(storage_for('https://h/x')) is HTTPStorage
    assert type(storage_for('memory://x')) is RemoteStorage
    assert type(storage_for('data/train')) is LocalStorage


def test_http_is_read_only_and_says_so_before_anything_is_written(tmp_path):
    storage = storage_for('http://127.0.0.1:9/data')
    with pytest.raises(ConfigError, match='read-only'):
        storage.open_write('http://127.0.0.1:9/data/x.bin')
    with pytest.raises(ConfigError, match='read-only'):
        storage.stage_dir('http://127.0.0.1:9/data/out')


def test_a_pickled_storage_keeps_its_class_and_settings():
    storage = remote_storage('https://h/x', {'loadr': {'retries': 2}})
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy) is type(storage) and copy.settings.retries == 2
    assert copy._one_range_hosts == set()           # HTTP's own per-process state, made anew


def test_storages_are_shared_within_one_open_and_never_across_opens():
    # One open makes its settings once and passes them down: its storages are shared.
    settings = settings_for('https://h/a', {'loadr': {'retries': 1}})
    a = remote_storage('https://h/a', settings)
    assert remote_storage('https://h/b', settings) is a
    assert remote_storage('https://h/b', {'loadr': {'retries': 1}}) is not a
    assert remote_storage('s3://b/x', settings) is not a
    # Another open (other settings, equal or not) learns afresh.
    assert remote_storage('https://h/a', settings_for('https://h/a', {'loadr': {'retries': 1}})) \
        is not a
    # A forked child's storages are its own, made with a copy of the settings.
    assert remote_storage('https://h/a', pickle.loads(pickle.dumps(settings))) is not a


def test_settings_are_checked_once_and_typed():
    settings = settings_for('s3://b/x', {'endpoint_url': 'http://h', 'loadr': {
        'retries': 3.0, 'timeout_s': 2}})
    assert (settings.retries, settings.timeout_s) == (3, 2.0) and type(settings.retries) is int
    assert dict(settings.options) == {'endpoint_url': 'http://h'}
    storage = remote_storage('s3://b/x', settings)
    assert storage.settings is settings
    with pytest.raises(ConfigError,
                       match=r"unknown storage_options\['loadr'\] settings \['retry'\]"):
        settings_for('s3://b/x', {'loadr': {'retry': 3}})
    with pytest.raises(ConfigError, match='s3_presigned must be True or False'):
        settings_for('s3://b/x', {'loadr': {'s3_presigned': 'yes'}})
    with pytest.raises(ConfigError, match='apply to URLs only'):
        settings_for('data/train', {'anon': True})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.retries = 1


def test_the_local_cache_is_asked_of_the_storage_never_probed():
    # A storage without a cache answers the clock's calls (a no-op): readers call them.
    local = LocalStorage()
    assert local.caching is False
    local.cache_clock('data', None, 0, 1)
    local.cache_flush()
    remote = remote_storage('https://h/x', {'loadr': {'cache_dir': None}})
    assert remote.caching is False
