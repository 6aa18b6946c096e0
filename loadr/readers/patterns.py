"""Dataset paths that name many files: brace ranges, globs and lists.

WebDataset shards are named ``train-{000000..000999}.tar`` and Parquet sets
``data/*.parquet``; a list of paths or URLs works too. :func:`expand` turns
any of them into the sorted or listed files, through the storage layer, so
a local path and a URL expand the same way (a glob lists the directory
above it; nothing else is listed).

>>> expand_braces('a-{01..03}.tar')
['a-01.tar', 'a-02.tar', 'a-03.tar']
>>> expand_braces('{train,val}/x.tar')
['train/x.tar', 'val/x.tar']
"""

from __future__ import annotations

import fnmatch
import os
import re

from ..errors import ConfigError, FormatError, LoadrError
from ..storage import StorageSettings, storage_for

__all__ = ['expand', 'expand_braces', 'is_pattern', 'names_files', 'names_nothing',
           'common_root', 'dataset_files']

_BRACE = re.compile(r'\{([^{}]*)\}')
_RANGE = re.compile(r'(-?\d+)\.\.(-?\d+)\Z')
# A pattern that would name more files than this is a mistake, not a dataset.
MAX_EXPANDED = 10_000_000


def is_pattern(path) -> bool:
    """True for a list of paths, or a path with ``{a..b}``, ``{a,b}``, ``*``, ``?`` or ``[``.

    >>> is_pattern('x/{0..9}.tar'), is_pattern('x/0.tar'), is_pattern(['a.tar'])
    (True, False, True)
    """
    if isinstance(path, (list, tuple)):
        return True
    if not isinstance(path, str):
        return False
    name = path.partition('://')[2] if '://' in path else path
    return bool(_BRACE.search(name)) or any(c in name for c in '*?[')


def names_files(path, storage_options: StorageSettings | dict | None = None) -> bool:
    """True when ``path`` is a list, or a pattern that is not itself an existing name
    (a folder called ``data[1]`` is a folder)."""
    if isinstance(path, (list, tuple)):
        return True
    if not is_pattern(path):
        return False
    try:
        return not storage_for(path, storage_options).exists(path)
    except Exception:       # a URL whose server cannot say: read as the pattern it looks like
        return True


def expand_braces(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for: ``{0..9}`` (zero-padded as written) and ``{a,b}``."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        lo, hi = numbers.groups()
        width = len(lo) if lo.lstrip('-').startswith('0') else 0
        a, b = int(lo), int(hi)
        if abs(b - a) >= MAX_EXPANDED:
            raise ConfigError(f'the range {{{body}}} names more than {MAX_EXPANDED} files',
                              pattern)
        step = 1 if b >= a else -1
        choices = [str(k).zfill(width) for k in range(a, b + step, step)]
    else:
        choices = body.split(',')
    head, tail = pattern[:match.start()], pattern[match.end():]
    out = []
    for choice in choices:
        out += expand_braces(head + choice + tail)
    return out


def _glob(storage, pattern: str) -> list[str]:
    """The files matching a glob in the last component (the directory above is listed)."""
    parent, _, name = pattern.rpartition('/')
    if any(c in parent for c in '*?['):
        raise ConfigError('only the file name may hold * ? or [...] (list the folders, or '
                          'give a {a..b} range)', pattern)
    parent = parent or '.'
    names = [n for n in storage.list(parent) if fnmatch.fnmatchcase(n, name)]
    return [f'{parent}/{n}' if parent != '.' or pattern.startswith('./') else n
            for n in sorted(names)]


def expand(path, storage_options: StorageSettings | dict | None = None) -> list[str]:
    """The files ``path`` names, in order: a list as given, braces as written, globs sorted.

    A FormatError names the first file of a brace range or list that does not exist.
    """
    if isinstance(path, (list, tuple)):
        files = [os.fspath(p) for p in path]
        if not files:
            raise ConfigError('an empty list of files')
    else:
        path = os.fspath(path)
        files = []
        for one in expand_braces(path):
            if any(c in (one.partition('://')[2] or one) for c in '*?['):
                files += _glob(storage_for(one, storage_options), one)
            else:
                files.append(one)
        if not files:
            raise FormatError('the pattern names no files', path)
    return files


def names_nothing(path, storage_options: StorageSettings | dict | None = None) -> str | None:
    """Why the pattern or list ``path`` gives no file to read, if it does not: a glob that
    matched nothing, or a first file that does not exist; else None. Never raises.

    >>> names_nothing('/nowhere/at/all/*.tar')[:62]
    'the pattern matched no file: its folder /nowhere/at/all cannot'
    """
    try:
        files = expand(path, storage_options)
    except LoadrError as exc:       # a glob over a folder that is not there, or empty
        if isinstance(path, (list, tuple)) or not any(c in path for c in '*?['):
            return None
        if exc.path is not None and exc.path != path:
            return f'the pattern matched no file: its folder {exc.path} cannot be listed ' \
                f'({exc.message})'
        return 'the pattern matched no file'
    except Exception:   # noqa: BLE001 - not a pattern expand() takes: the caller says more
        return None
    if not files:
        return 'the pattern matched no file'
    try:
        missing = [f for f in files[:1] if not storage_for(f, storage_options).exists(f)]
    except Exception:   # noqa: BLE001 - a server that cannot say: the plain message
        return None
    if missing:
        what = 'list' if isinstance(path, (list, tuple)) else 'pattern'
        return (f'the {what} names {len(files)} file{"s" if len(files) != 1 else ""}, and the '
                f'first, {missing[0]}, does not exist')
    return None


def common_root(files: list[str]) -> str:
    """The deepest directory holding every file of ``files`` (URLs too).

    >>> common_root(['d/a/x.tar', 'd/b/y.tar']), common_root(['http://h/s/a.tar'])
    ('d', 'http://h/s')
    """
    parts = [f.split('/')[:-1] for f in files]
    common = parts[0]
    for p in parts[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    root = '/'.join(common)
    if root.endswith(':/') or root.endswith(':'):       # 'http://' split into 'http:', ''
        root = files[0].rsplit('/', 1)[0]
    return root or '.'


def dataset_files(path, suffixes: tuple, what: str,
                  storage_options: StorageSettings | dict | None = None) -> tuple[str, list[str]]:
    """``(root, files)``: the files ``path`` names, and the directory they are named
    relative to: a pattern or a list (:func:`expand`), a directory (its files ending in
    ``suffixes``, hidden ones left out), or one file. ``what`` names the files in the
    error of a directory that holds none.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / 'a.tar').write_bytes(b''), (d / '.b.tar').write_bytes(b'')
    >>> root, files = dataset_files(str(d), ('.tar',), '.tar')
    >>> root == str(d), [pathlib.Path(f).name for f in files]
    (True, ['a.tar'])
    """
    if names_files(path, storage_options):
        files = expand(path, storage_options)
        return common_root(files), files
    path = os.fspath(path)
    storage = storage_for(path, storage_options)
    if storage.isdir(path):
        try:
            names = storage.list(path)
        except LoadrError as exc:
            raise FormatError(f'cannot list directory: {exc.message}', path) from exc
        files = [f'{path.rstrip("/")}/{n}' for n in names
                 if n.endswith(suffixes) and not n.startswith('.')]
        if not files:
            raise FormatError(f'directory holds no {what} files', path)
        return path, files
    return os.path.dirname(path) or '.', [path]
