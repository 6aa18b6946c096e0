"""Where a writer keeps its output until it is complete, and what is left when it is killed.

Every writer writes under a hidden sibling of its target and renames it into
place on success, so an interrupted write never leaves anything that opens
as a dataset. The sibling's name says whose it is::

    .<target name>.loadr-tmp-<host>-<pid>-<random>

A writer killed outright (SIGKILL, out of memory) cannot remove its sibling;
the next writer of the same target does, once the pid no longer runs on
this host. Siblings of other hosts (a shared filesystem) are left alone: a
pid means nothing across machines.

This is the local storage's own mechanism (:mod:`loadr.storage` uses it for
``open_write`` and ``stage_dir``); readers and writers never call it directly.

Example::

    reclaim(path)                          # the leftovers of killed writers of path
    tmp = make(path, directory=True)       # .out.loadr-tmp-node1-4242-9f3a0c1d
    ...                                    # write into tmp
    os.rename(tmp, path)
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket

from ..pids import running

__all__ = ['MARK', 'make', 'reclaim']

MARK = '.loadr-tmp-'


def _host() -> str:
    # Kept to the characters of a file name we can parse back.
    return re.sub(r'[^A-Za-z0-9_.]', '_', socket.gethostname())[:64] or 'host'


def _prefix(path: str) -> tuple[str, str]:
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    return parent, f'.{name}{MARK}'


def make(path, directory: bool = False) -> str:
    """Create a fresh hidden sibling of ``path`` (a file, or a directory) and return its path.

    >>> os.path.basename(make('/tmp/out.ffr')).startswith('.out.ffr.loadr-tmp-')  # doctest: +SKIP
    True
    """
    parent, prefix = _prefix(path)
    while True:
        tmp = os.path.join(parent, f'{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(4)}')
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def reclaim(path) -> list[str]:
    """Remove the hidden siblings of ``path`` left by writers of this host that no longer run.

    Returns what was removed. Anything it cannot parse or remove is left as it is.
    """
    parent, prefix = _prefix(path)
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    here = f'{_host()}-'
    for name in names:
        if not name.startswith(prefix + here):
            continue
        pid = name[len(prefix + here):].split('-', 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or running(int(pid)):
            continue
        full = os.path.join(parent, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        except OSError:
            continue
        removed.append(full)
    return removed
