"""The hidden siblings writers write into, and the reclaim of killed writers' leftovers."""

from __future__ import annotations

import os
import subprocess
import sys

from loadr.storage import staging


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()
    return proc.pid


def test_make_gives_a_fresh_hidden_sibling_naming_host_and_pid(tmp_path):
    a = staging.make(tmp_path / 'out.ffr')
    b = staging.make(tmp_path / 'out', directory=True)
    assert os.path.isfile(a) and os.path.isdir(b) and a != staging.make(tmp_path / 'out.ffr')
    for made, name in ((a, 'out.ffr'), (b, 'out')):
        base = os.path.basename(made)
        assert base.startswith(f'.{name}{staging.MARK}{staging._host()}-{os.getpid()}-')


def test_reclaim_removes_only_dead_writers_of_this_host_and_this_target(tmp_path):
    prefix = f'.out{staging.MARK}{staging._host()}'
    dead_file = tmp_path / f'{prefix}-{dead_pid()}-aaaa'
    dead_dir = tmp_path / f'{prefix}-{dead_pid()}-bbbb'
    dead_file.write_bytes(b'half a file')
    dead_dir.mkdir()
    (dead_dir / 'data_0.gulp').write_bytes(b'x')
    keep = [tmp_path / f'{prefix}-{os.getpid()}-cccc',                   # ours, in progress
            tmp_path / f'{prefix}-1-dddd',                                # pid 1 always runs
            tmp_path / f'.out{staging.MARK}otherhost-{dead_pid()}-eeee',  # another machine's
            tmp_path / f'.other{staging.MARK}{staging._host()}-{dead_pid()}-ffff',  # another target
            tmp_path / f'{prefix}-notapid-gggg',
            tmp_path / 'out']
    for path in keep:
        path.write_bytes(b'')
    removed = staging.reclaim(tmp_path / 'out')
    assert sorted(removed) == sorted([str(dead_file), str(dead_dir)])
    assert sorted(tmp_path.iterdir()) == sorted(keep)
    assert staging.reclaim(tmp_path / 'missing-dir' / 'out') == []
