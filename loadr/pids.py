"""What loadr knows about processes: alive, stopped or frozen, and who owns what.

Everything here reads ``/proc`` and ``/sys/fs/cgroup`` (Linux); elsewhere the
answers degrade to "unknown" (None), never to a guess.

Example::

    running(os.getpid())        # True
    frozen(worker_pid)          # None, or why it cannot run: 'stopped (...)'
"""

from __future__ import annotations

import os

__all__ = ['running', 'proc_stat', 'frozen', 'cgroup_dir']


def running(pid: int) -> bool:
    """True if a process with this pid exists (in this pid namespace).

    >>> running(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True             # another user's process: it runs
    return True


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, cpu ticks, start ticks)`` of ``pid`` from ``/proc/<pid>/stat``; None if gone.

    ``state`` is one letter (R running, S sleeping, D disk wait, T stopped,
    t traced, Z zombie, ...), cpu ticks are user + system time, and start
    ticks the start time after boot: with the pid, it names one process for
    the whole uptime (a pid alone can be reused).

    >>> proc_stat(os.getpid())[0] in 'RS'
    True
    """
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(b')') + 2:].split()
    try:
        return fields[0].decode(), int(fields[11]) + int(fields[12]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each mount this process sees."""
    found = []
    try:
        with open('/proc/self/mountinfo') as f:
            for line in f:
                left, _, right = line.partition(' - ')
                a, b = left.split(), right.split()
                if len(a) >= 5 and len(b) >= 3:
                    found.append((a[3], a[4], b[0], b[2]))
    except OSError:
        pass
    return found


def cgroup_dir(pid: int | str, controller: str | None) -> str | None:
    """The directory of ``pid``'s cgroup: the unified (v2) one for ``controller=None``,
    else the v1 hierarchy that has ``controller`` (e.g. 'freezer', 'memory'); None if
    there is none or it is not mounted here.

    >>> cgroup_dir('self', 'no-such-controller') is None
    True
    """
    try:
        with open(f'/proc/{pid}/cgroup') as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, _, rest = line.partition(':')
        controllers, _, path = rest.partition(':')
        if controller is None and not (hid == '0' and controllers == ''):
            continue
        if controller is not None and controller not in controllers.split(','):
            continue
        for root, point, fstype, options in _mounts():
            if controller is None and fstype != 'cgroup2':
                continue
            if controller is not None and (fstype != 'cgroup'
                                           or controller not in options.split(',')):
                continue
            if path == root or path.startswith(root.rstrip('/') + '/'):
                return os.path.join(point, path[len(root.rstrip('/')):].lstrip('/'))
    return None


def _cgroup_frozen(pid: int) -> bool:
    v2 = cgroup_dir(pid, None)
    if v2 is not None:
        try:
            with open(os.path.join(v2, 'cgroup.events')) as f:
                if 'frozen 1' in f.read().splitlines():
                    return True
        except OSError:
            pass
    v1 = cgroup_dir(pid, 'freezer')
    if v1 is not None:
        try:
            with open(os.path.join(v1, 'freezer.state')) as f:
                return f.read().strip() in ('FROZEN', 'FREEZING')
        except OSError:
            pass
    return False


def frozen(pid: int) -> str | None:
    """Why ``pid`` cannot run now, or None if it can (or is gone).

    Stopped (SIGSTOP, SIGTSTP, a debugger holding it) or frozen by a cgroup
    freezer (``docker pause``, systemd, a job scheduler). A process that is
    merely slow, sleeping or waiting on a disk is not frozen.

    >>> frozen(os.getpid()) is None
    True
    """
    stat = proc_stat(pid)
    if stat is None:
        return None
    if stat[0] == 'T':
        return 'stopped (SIGSTOP or SIGTSTP)'
    if stat[0] == 't':
        return 'stopped by a debugger'
    if _cgroup_frozen(pid):
        return 'frozen by its cgroup (a cgroup freezer, docker pause)'
    return None
