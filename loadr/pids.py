"""What loadr knows about processes: alive, stopped or frozen, and who owns what.

Everything here reads ``/proc`` and ``/sys/fs/cgroup`` (Linux); elsewhere the
answers degrade to "unknown" (None), never to a guess.

A pid alone does not name an owner: pids are reused, and a process of another
pid namespace (a container sharing /tmp or /dev/shm) has a pid that means
nothing here. :func:`me` records the owner as boot id, pid namespace, pid and
start time; :func:`owner_gone` says True only when that owner provably no
longer runs.

Example::

    running(os.getpid())        # True
    frozen(worker_pid)          # None, or why it cannot run: 'stopped (...)'
    owner_gone(me())            # False
"""

from __future__ import annotations

import os

__all__ = ['running', 'proc_stat', 'same_process', 'frozen', 'cgroup_dir', 'me', 'owner_gone']


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


def same_process(pid: int, start: int | None) -> bool:
    """True while the process ``pid`` that started at ``start`` (ticks, from
    :func:`proc_stat`) runs; a zombie does not run, a reused pid is another process.
    Without ``/proc`` (or ``start``), whether any process has that pid.

    >>> same_process(os.getpid(), proc_stat(os.getpid())[2])
    True
    """
    stat = proc_stat(pid)
    if stat is None:
        return running(pid) if start is None or proc_stat(os.getpid()) is None else False
    return stat[0] != 'Z' and (start is None or stat[2] == start)


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


def _boot_id() -> str | None:
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink('/proc/self/ns/pid')        # e.g. 'pid:[4026531836]'
    except OSError:
        return None


def me() -> dict:
    """This process as an owner: ``{'boot', 'pidns', 'pid', 'start'}`` (None where unknown).

    >>> me()['pid'] == os.getpid()
    True
    """
    stat = proc_stat(os.getpid())
    return {'boot': _boot_id(), 'pidns': _pid_namespace(), 'pid': os.getpid(),
            'start': None if stat is None else stat[2]}


def owner_gone(owner: dict) -> bool:
    """True only if the process ``owner`` (from :func:`me`, maybe in another process,
    another boot) provably no longer runs. Unknown is False: keep what it owns.

    Another boot: gone. Another pid namespace: unknown (its pids mean nothing
    here, and it may run). Same namespace: gone if no process has that pid,
    or the one that has it started at another time (the pid was reused).

    >>> owner_gone(me())
    False
    >>> owner_gone({**me(), 'boot': 'another boot'})
    True
    """
    here = me()
    boot = owner.get('boot')
    if boot is not None and here['boot'] is not None and boot != here['boot']:
        return True
    if here['pidns'] is None or here['start'] is None or owner.get('pidns') != here['pidns']:
        return False                # /proc unreadable, or another namespace: cannot tell
    pid, start = owner.get('pid'), owner.get('start')
    if type(pid) is not int or type(start) is not int or pid <= 0:
        return False
    stat = proc_stat(pid)
    return stat is None or stat[2] != start
