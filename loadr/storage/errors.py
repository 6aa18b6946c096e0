"""Every failure of a storage becomes a loadr error here, in one place.

Local files: :func:`read_error` and :class:`mapped` turn an ``OSError`` into
a :class:`~loadr.errors.ReadError` naming the path and the index, with
``transient`` set for the errnos a retry may cure; :func:`transient` is what
the loader's retry policy asks.

Remote objects: :func:`kind` sorts an exception of aiohttp, botocore, s3fs
or fsspec (by its HTTP status and class names, without importing them) into
'transient', 'missing', 'denied', 'credentials', 'changed' or 'other', and
:func:`remote_error` makes the one-line ReadError that names the URL, the
record and the attempts. The internal exceptions below (a short body, a
wrong range, another version) are raised by the range parsers and the
version checks and sorted here like the libraries' own.
"""

from __future__ import annotations

import errno
import re
from typing import Any, TypeVar

from ..errors import LoadrError, ReadError

E = TypeVar('E', bound=BaseException)

__all__ = ['read_error', 'mapped', 'transient', 'TRANSIENT_ERRNOS', 'kind', 'remote_error',
           'for_record', 'one_line', 'KIND_TEXT', 'ShortBody', 'WrongRange', 'VersionChanged',
           'with_details']

# Errors of the OS that may pass when the read is tried again (a network
# filesystem's hiccup, an interrupted call); anything else is final.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT,
                              errno.ESTALE})


def read_error(exc: OSError, path: str, index: int | None) -> ReadError:
    """A ReadError for an OSError, naming the file, the index and the errno.

    ``transient`` is True for the errors a retry may cure (EIO, EAGAIN, …).

    >>> err = read_error(OSError(errno.EIO, 'Input/output error'), 'x.bag', 3)
    >>> str(err), err.transient
    ('x.bag [index 3]: cannot read (EIO): Input/output error', True)
    """
    name = errno.errorcode.get(exc.errno or 0, 'error')
    err = ReadError(f'cannot read ({name}): {exc.strerror or exc}', path, index)
    err.errno = exc.errno
    return with_details(err, transient=exc.errno in TRANSIENT_ERRNOS)


def with_details(err: E, **details: Any) -> E:
    """``err`` with ``details`` as attributes (``transient``, ``attempts``, ``kind``,
    ``deadline_spent``): what a storage says of a failure beyond its message. Not every
    error has them: they are read with ``getattr(err, name, default)``.

    >>> with_details(ReadError('gone', 'x'), transient=False).transient
    False
    """
    vars(err).update(details)
    return err


class mapped:
    """Context manager: an ``OSError`` inside becomes a ReadError naming ``path`` and ``index``.

    loadr's own errors pass through unchanged. A class, not a generator, so
    entering it costs next to nothing.

    >>> with mapped('missing.bag', 7):                     # doctest: +SKIP
    ...     open('missing.bag', 'rb')
    Traceback (most recent call last):
    loadr.errors.ReadError: missing.bag [index 7]: cannot read (ENOENT): No such file or directory
    """

    __slots__ = ('path', 'index')

    def __init__(self, path: str, index: int | None = None):
        self.path, self.index = path, index

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, OSError) and not isinstance(exc, LoadrError):
            raise read_error(exc, self.path, self.index) from exc
        return False


def transient(exc: BaseException) -> bool:
    """True when a failed read may succeed if tried again (the retry policy asks this).

    A ReadError says so itself (its storage set ``transient``); a bare
    ``OSError`` (or one in ``__cause__``) is judged by its errno.

    >>> transient(read_error(OSError(errno.EIO, 'I/O'), 'x', 0)), transient(ValueError())
    (True, False)
    """
    for e in (exc, exc.__cause__):
        if e is None:
            continue
        flag = getattr(e, 'transient', None)
        if flag is not None:
            return bool(flag)
        if isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS:
            return True
    return False



# ---------------------------------------------------------------------------
# Remote objects


class ShortBody(Exception):
    """Fewer bytes came than were asked for (a connection cut mid-body)."""


class WrongRange(Exception):
    """A 206 answer for other bytes than were asked (its range, length or total size).

    Transient: a cache or a proxy between us and the server may have mixed up
    two answers; asked again, the server gives the right bytes or the retries
    end in a ReadError naming the URL and the record.
    """


class VersionChanged(Exception):
    """The answer came from another version of the object than the reader opened."""


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind an exception of aiohttp, botocore or s3fs, if any."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is None:
            continue
        status = getattr(e, 'status', None)
        if isinstance(status, int):
            return status
        response = getattr(e, 'response', None)
        if isinstance(response, dict):
            code = response.get('ResponseMetadata', {}).get('HTTPStatusCode')
            if isinstance(code, int):
                return code
    return None


def _names(exc: BaseException) -> set[str]:
    """Class names of the exception, its bases and its causes (no import of the libraries)."""
    names: set[str] = set()
    seen = 0
    at: BaseException | None = exc
    while at is not None and seen < 4:
        names.update(cls.__name__ for cls in type(at).__mro__)
        at = at.__cause__ or at.__context__
        seen += 1
    return names


_TRANSIENT_NAMES = {
    'ShortBody', 'WrongRange', 'TimeoutError', 'ClientPayloadError', 'ServerDisconnectedError',
    'ClientConnectionError', 'ClientOSError', 'ServerTimeoutError', 'ConnectionError',
    'EndpointConnectionError', 'ConnectionClosedError', 'ReadTimeoutError',
    'ConnectTimeoutError', 'IncompleteReadError', 'ResponseStreamingError', 'IncompleteRead',
    'ContentLengthError', 'FSTimeoutError', 'ResponseParserError',
}
_CREDENTIAL_NAMES = {'NoCredentialsError', 'PartialCredentialsError', 'CredentialRetrievalError',
                     'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'ExpiredToken',
                     'DefaultCredentialsError', 'RefreshError'}


def kind(exc: BaseException) -> str:
    """'transient', 'missing', 'denied', 'credentials', 'changed' or 'other'."""
    names = _names(exc)
    if names & _CREDENTIAL_NAMES:
        return 'credentials'
    status = _status(exc)
    if status == 412 or 'VersionChanged' in names:     # If-Match / If-Unmodified-Since refused
        return 'changed'
    if status is not None:
        if status == 404:
            return 'missing'
        if status in (401, 403):
            return 'denied'
        if status in (408, 429) or status >= 500:
            return 'transient'
        if status >= 400:
            return 'other'
    if isinstance(exc, FileNotFoundError):
        # fsspec's HTTP stat turns any failure, a refused connection too, into this.
        cause = exc.__cause__
        return 'transient' if cause is not None and kind(cause) == 'transient' else 'missing'
    if isinstance(exc, PermissionError):
        return 'denied'
    if names & _TRANSIENT_NAMES:
        return 'transient'
    return 'other'


KIND_TEXT = {
    'missing': 'no such object, bucket or directory',
    'denied': 'access denied: check the credentials and their permissions '
              '(AWS_* variables, storage_options)',
    'credentials': 'no valid credentials: set them in the environment (e.g. AWS_ACCESS_KEY_ID '
                   'and AWS_SECRET_ACCESS_KEY), in storage_options, or use '
                   "storage_options={'anon': True} for public data",
    'changed': 'the object changed since the reader was made (the server holds another '
               'version than the one opened); open the dataset again to read the new version',
}


# The parts of a presigned URL that grant access (S3's SigV2 and SigV4 query strings):
# never in a message, where a log would keep them for the hour the URL is good for.
_SECRET_QUERY = re.compile(r'((?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|'
                           r'Signature|AWSAccessKeyId|x-amz-security-token)=)[^&\s\'"]+')


def one_line(exc: BaseException) -> str:
    """``ClassName: message`` on one line, at most 200 characters of message, the
    signatures of presigned URLs taken out.

    >>> one_line(OSError('GET http://h/b/k?Signature=abc%2B&Expires=9 failed'))
    'OSError: GET http://h/b/k?Signature=...&Expires=9 failed'
    """
    text = ' '.join(str(exc).split()) or type(exc).__name__
    text = _SECRET_QUERY.sub(r'\1...', text)
    return f'{type(exc).__name__}: {text[:200]}'


def remote_error(exc: BaseException, url: str, index: int | None, attempts: int,
                 what: str = 'read') -> LoadrError:
    """The loadr error for a failed operation on ``url`` (its library's exception as text)."""
    if isinstance(exc, LoadrError):
        return exc
    found = kind(exc)
    if found in KIND_TEXT:
        err = ReadError(f'cannot {what}: {KIND_TEXT[found]} ({one_line(exc)})', url, index)
    else:
        tries = f' after {attempts} attempts' if attempts > 1 else ''
        err = ReadError(f'cannot {what}{tries}: {one_line(exc)}', url, index)
    # Our own retries are spent: the loader's retry policy must not start them again.
    return with_details(err, attempts=attempts, transient=False, kind=found)


def for_record(exc: LoadrError, path: str, index: int | None) -> LoadrError:
    """``exc`` (an error of a read that served several records) for the record at ``index``."""
    if exc.path == path and exc.index == index:
        return exc
    err = type(exc)(exc.message, path, index)
    err.__dict__.update({k: v for k, v in exc.__dict__.items()
                         if k not in ('message', 'path', 'index')})
    return err
