"""S3 (``s3://``, ``s3a://``): the remote storage over s3fs, with what S3 does differently.

botocore's own retries are turned off (ours are the whole policy, and
counted); a range is a ``get_object`` with ``Range`` and ``IfMatch`` (the
version the reader opened), its ``ContentRange`` and ETag checked.
"""

from __future__ import annotations

from .ranges import check_part, content_range
from .remote import RemoteStorage

__all__ = ['S3Storage']


class S3Storage(RemoteStorage):
    """The storage of ``s3://`` URLs (any S3-compatible store: ``endpoint_url``)."""

    def _fs_options(self, options: dict) -> dict:
        # We retry; botocore's own retries would multiply ours (and hide the count).
        config = dict(options.get('config_kwargs') or {})
        config.setdefault('retries', {'max_attempts': 1, 'mode': 'standard'})
        # botocore keeps 10 connections by default: more requests than that in flight
        # (the read-ahead keeps up to max_concurrency) queued for one, which showed as
        # round trips of 200 ms behind a 20 ms proxy.
        config.setdefault('max_pool_connections', int(self.settings['max_concurrency']))
        options['config_kwargs'] = config
        return options

    async def _range_once(self, path: str, start: int, end: int, index: int | None) -> bytes:
        """One attempt at bytes ``[start, end)`` of an S3 object, its ContentRange checked."""
        fs = self.fs
        bucket, key, version = fs.split_path(path)
        self.requests += 1
        answer = await fs._call_s3('get_object', Bucket=bucket, Key=key,
                                   Range=f'bytes={start}-{end - 1}',
                                   **({'VersionId': version} if version else {}),
                                   **self._s3_conditions(path))
        try:
            self._check_version(path, answer.get('ETag'))
            body = await answer['Body'].read()
        finally:
            answer['Body'].close()
        self.bytes_fetched += len(body)
        header = answer.get('ContentRange')
        got = content_range(header) if header else (start, start + len(body), None)
        check_part((start, end), got, len(body), self._sizes.get(path))
        return body

    def _s3_conditions(self, path: str) -> dict:
        """The ``get_object`` keywords that ask for the version of ``path`` the reader
        opened (S3 answers 412 PreconditionFailed for another)."""
        etag = (self._versions.get(path) or (None,))[0]
        return {'IfMatch': etag} if etag and not etag.startswith('W/') else {}
