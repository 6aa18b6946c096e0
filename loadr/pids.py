"""Whether a process still runs: how stale shared memory and killed writers' files are judged.

Example::

    running(os.getpid())    # True
"""

from __future__ import annotations

import os

__all__ = ['running']


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
