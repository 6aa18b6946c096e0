"""Fault tests start real scripts; none may outlive its test, pass or fail."""

from __future__ import annotations

import pytest

from loadr.workers.shm import reclaim_stale

from .helpers import STARTED, kill_group


@pytest.fixture(autouse=True)
def no_script_left_running():
    yield
    killed = False
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            kill_group(proc)        # the script and its workers: one process group
            proc.communicate()
            killed = True
        else:
            proc.communicate()      # close its pipes
    if killed:
        reclaim_stale()             # what the SIGKILLed group could not unlink
