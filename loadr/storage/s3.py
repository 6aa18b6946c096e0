"""S3 (``s3://``, ``s3a://``): the remote storage over s3fs, with what S3 does differently.

botocore's own retries are turned off (ours are the whole policy, and
counted). A range is a GET of the object's presigned URL with ``Range`` and
``If-Match`` (the version the reader opened), its ``Content-Range`` and ETag
checked (:mod:`loadr.storage.s3gets`: a signature per object, not per
range); where that cannot carry the options, or with
``storage_options['loadr']['s3_presigned'] = False``, a ``get_object``.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from .ranges import check_part, content_range
from .remote import RemoteStorage

if TYPE_CHECKING:
    from .s3gets import PresignedGets

__all__ = ['S3Storage']

# The presigned GETs of each filesystem (one per process and options: see filesystems).
_gets: dict[int, PresignedGets] = {}
_gets_lock = threading.Lock()


def _after_fork() -> None:
    global _gets_lock
    _gets_lock = threading.Lock()       # a thread of the parent may have held it at the fork


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork)


def _profile_signature(options: dict) -> str | None:
    """The S3 signature version the AWS config file's profile sets (``s3 =
    signature_version = ...``), if any; read once per profile and config file (a forked
    worker has its parent's answer)."""
    key = (options.get('profile'), os.environ.get('AWS_CONFIG_FILE'),
           os.environ.get('AWS_PROFILE'))
    if key not in _profile_signatures:
        try:
            import botocore.session
            scoped = botocore.session.Session(profile=key[0]).get_scoped_config()
            s3 = scoped.get('s3')
            found = s3.get('signature_version') if isinstance(s3, dict) else None
        except Exception:       # a profile that does not exist: s3fs says so when it opens
            found = None
        _profile_signatures[key] = found
    return _profile_signatures[key]


_profile_signatures: dict[tuple, str | None] = {}


class S3Storage(RemoteStorage):
    """The storage of ``s3://`` URLs (any S3-compatible store: ``endpoint_url``)."""

    def _fs_options(self, options: dict) -> dict:
        # We retry; botocore's own retries would multiply ours (and hide the count).
        config = dict(options.get('config_kwargs') or {})
        config.setdefault('retries', {'max_attempts': 1, 'mode': 'standard'})
        # botocore keeps 10 connections by default: more requests than that in flight
        # (the read-ahead keeps up to max_concurrency) queued for one, which showed as
        # round trips of 200 ms behind a 20 ms proxy.
        config.setdefault('max_pool_connections', int(self.settings.max_concurrency))
        # botocore presigns with Signature Version 2 where a region still takes it (its
        # requests are SigV4 already): S3 refuses SigV2 for buckets made after June 2020.
        # A version the profile sets (a store that needs another) is left to rule both.
        if 'signature_version' not in config and not _profile_signature(options):
            config['signature_version'] = 's3v4'
        options['config_kwargs'] = config
        return options

    def _init_process(self) -> None:
        super()._init_process()
        self._no_presign: set[str] = set()      # buckets that redirect a presigned GET

    def _presigned(self, bucket: str):
        """The filesystem's :class:`~loadr.storage.s3gets.PresignedGets`, or None where a
        range is a ``get_object`` (the setting, the options, or a redirecting bucket)."""
        if not self.settings.s3_presigned or bucket in self._no_presign:
            return None
        fs = self.fs
        gets = _gets.get(id(fs))
        if gets is None or gets.fs is not fs:
            from .s3gets import PresignedGets, presignable
            if not presignable(self.options):
                return None
            with _gets_lock:
                gets = _gets.get(id(fs))
                if gets is None or gets.fs is not fs:
                    gets = _gets[id(fs)] = PresignedGets(
                        fs, self.options, int(self.settings.max_concurrency))
        return gets

    async def _range_once(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """One attempt at bytes ``[start, end)`` of an S3 object, its ContentRange checked."""
        fs = self.fs
        bucket, key, version = fs.split_path(path)
        self.requests += 1
        gets = self._presigned(bucket)
        if gets is not None:
            from .s3gets import Redirected
            headers = {'Range': f'bytes={start}-{end - 1}', **self.versions.conditions(path)}
            headers.pop('If-Unmodified-Since', None)    # get_object's path sends IfMatch alone
            try:
                answer, body = await gets.get(bucket, key, version, headers)
            except Redirected:
                self._no_presign.add(bucket)
                return await self._range_once(path, start, end, index)
            etag, header = answer.get('ETag'), answer.get('Content-Range')
        else:
            answer = await fs._call_s3('get_object', Bucket=bucket, Key=key,
                                       Range=f'bytes={start}-{end - 1}',
                                       **({'VersionId': version} if version else {}),
                                       **self._s3_conditions(path))
            try:
                etag = answer.get('ETag')
                self.versions.check(path, etag)
                body = await answer['Body'].read()
            finally:
                answer['Body'].close()
            header = answer.get('ContentRange')
        self.versions.check(path, etag)
        self.bytes_fetched += len(body)
        got = content_range(header) if header else (start, start + len(body), None)
        check_part((start, end), got, len(body), self.versions.size_of(path))
        return body

    def _s3_conditions(self, path: str) -> dict:
        """The ``get_object`` keywords that ask for the version of ``path`` the reader
        opened (S3 answers 412 PreconditionFailed for another)."""
        etag = self.versions.etag(path)
        return {'IfMatch': etag} if etag and not etag.startswith('W/') else {}
