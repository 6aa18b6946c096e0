"""Parsing the answers to byte-range requests: ``Content-Range`` and ``multipart/byteranges``.

Every answer is checked against what was asked (its range, its length, the
file's size when it was opened): an answer for other bytes is a
:class:`~loadr.storage.errors.WrongRange`, a body cut short a
:class:`~loadr.storage.errors.ShortBody`; both are transient (retried).
"""

from __future__ import annotations

from .errors import ShortBody, WrongRange

__all__ = ['boundary', 'content_range', 'check_part', 'byteranges', 'cut']


def boundary(content_type: str) -> bytes:
    """The boundary of a ``multipart/byteranges`` Content-Type."""
    for param in content_type.split(';')[1:]:
        key, _, value = param.strip().partition('=')
        if key.strip().lower() == 'boundary':
            return value.strip().strip('"').encode('latin-1')
    raise ShortBody(f'multipart answer without a boundary ({content_type!r})')


def content_range(value: str) -> tuple[int, int, int | None]:
    """``(start, end, size)`` of a ``Content-Range: bytes a-b/size`` header: bytes
    ``[start, end)`` of a file of ``size`` bytes (None for ``*``).

    >>> content_range('bytes 0-9/100'), content_range('bytes 5-5/*')
    ((0, 10, 100), (5, 6, None))
    """
    unit, _, rest = value.strip().partition(' ')
    span, _, total = rest.partition('/')
    first, _, last = span.partition('-')
    total = total.strip()
    if (unit.lower() != 'bytes' or not first.strip().isdigit() or not last.strip().isdigit()
            or not (total.isdigit() or total == '*') or int(last) < int(first)):
        raise WrongRange(f'unreadable Content-Range {value!r}')
    return int(first), int(last) + 1, int(total) if total != '*' else None


def check_part(asked: tuple[int, int] | None, got: tuple[int, int, int | None], length: int,
                size: int | None) -> None:
    """Raise WrongRange (or ShortBody) unless an answer of ``length`` bytes with
    Content-Range ``got`` is bytes ``asked`` (None: any) of a file of ``size`` bytes.

    >>> check_part((0, 10), (0, 10, 100), 10, 100)
    >>> check_part((0, 10), (10, 20, 100), 10, 100)
    Traceback (most recent call last):
    loadr.storage.errors.WrongRange: asked for bytes 0-9, the answer holds bytes 10-19
    """
    first, last, total = got
    if asked is not None and (first, last) != tuple(asked):
        raise WrongRange(f'asked for bytes {asked[0]}-{asked[1] - 1}, the answer holds bytes '
                          f'{first}-{last - 1}')
    if total is not None and size is not None and total != size:
        raise WrongRange(f'the answer gives the file {total} bytes, not the {size} it had '
                          f'when it was opened')
    if length < last - first:
        raise ShortBody(f'got {length} of {last - first} bytes at offset {first}')
    if length > last - first:
        raise WrongRange(f'got {length} bytes for the {last - first} of bytes '
                          f'{first}-{last - 1}')


def byteranges(body: bytes, boundary: bytes, size: int | None = None
                ) -> list[tuple[int, int, bytes]]:
    r"""The parts of a ``multipart/byteranges`` body: ``(start, end, bytes)``.

    Each part's length comes from its Content-Range, so the boundary is never
    searched for inside the data (where it may well occur). A part of a file
    of another ``size`` (when given) is a WrongRange.

    >>> body = (b'\r\n--B\r\nContent-Range: bytes 0-2/9\r\n\r\nabc'
    ...         b'\r\n--B\r\nContent-Range: bytes 6-8/9\r\n\r\n--B\r\n--B--\r\n')
    >>> byteranges(body, b'B')
    [(0, 3, b'abc'), (6, 9, b'--B')]
    >>> byteranges(body, b'B', size=10)        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    loadr.storage.errors.WrongRange: the answer gives the file 9 bytes, not the 10 it had ...
    """
    delimiter = b'--' + boundary
    parts: list[tuple[int, int, bytes]] = []
    at = body.find(delimiter)
    while at >= 0:
        at += len(delimiter)
        if body[at:at + 2] == b'--':
            return parts                        # the closing delimiter
        head_end = body.find(b'\r\n\r\n', at)
        if head_end < 0:
            break
        span = None
        for line in body[at:head_end].decode('latin-1').split('\r\n'):
            name, _, value = line.partition(':')
            if name.strip().lower() == 'content-range':
                span = content_range(value)
                check_part(None, span, span[1] - span[0], size)
        if span is None:
            raise ShortBody('a part of a multipart answer has no Content-Range')
        start = head_end + 4
        stop = start + span[1] - span[0]
        if stop > len(body):
            break
        parts.append((span[0], span[1], body[start:stop]))
        at = body.find(delimiter, stop)
    raise ShortBody(f'the multipart answer was cut short after {len(parts)} parts')


def cut(parts: list[tuple[int, int, bytes]], start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` out of the part that holds them, if one does."""
    for first, last, data in parts:
        if first <= start and end <= last:
            return data[start - first:end - first]
    return None
