"""loadr.storage.cache: the next use of each index, the furthest-next-use cache and its directory.

Real files in tmp_path and real processes where processes share a directory;
nothing here looks at a clock.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import pickle
import re
import shutil
import subprocess

import numpy as np
import pytest

import loadr.storage.cache as cache_module
from loadr.errors import ConfigError, ResourceError
from loadr.order import Order
from loadr.storage import cachedir, policy
from loadr.storage.cache import RangeCache
from loadr.storage.cachedir import (
    DEFAULT_CAP,
    JOURNAL_NAME,
    LOCK_NAME,
    MARKER_NAME,
    TMP_PREFIX,
    default_budget,
    entry_name,
)
from loadr.storage.policy import NEVER, NextUse

# <key: 24 hex><crc32: 8 hex>-<index>-<length>
ENTRY = re.compile(r'[0-9a-f]{32}-(\d+)-(\d+)\Z')
PATH = 's3://bucket/data.bag'


# -- helpers -----------------------------------------------------------------


def brute_next_use(order: Order, indices, now: int) -> list[int]:
    """The first position q >= now holding each index, by scanning the stream."""
    stream = order.indices(0, now + 2 * order.n).tolist()
    out = []
    for i in indices:
        found = [q for q in range(now, len(stream)) if stream[q] == i]
        out.append(found[0] if found else NEVER)
    return out


def payload(index: int, length: int) -> bytes:
    """The bytes of record ``index``: depend on both, so a mix-up shows."""
    seed = hashlib.sha1(f'{index}:{length}'.encode()).digest()
    return (seed * (length // len(seed) + 1))[:length]


def layout(sizes) -> list[tuple[int, int]]:
    """(offset, length) of each record laid end to end in one file."""
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return [(int(o), int(s)) for o, s in zip(offsets, sizes)]


def item(index: int, ranges) -> tuple:
    offset, length = ranges[index]
    return (PATH, offset, length, index, payload(index, length))


def cached_indices(directory) -> dict[int, int]:
    """{index: length} of the entries in the directory."""
    out = {}
    for name in os.listdir(directory):
        m = ENTRY.match(name)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


def entry_bytes(directory) -> int:
    return sum(cached_indices(directory).values())


def temp_files(directory) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(TMP_PREFIX)]


def entry_path(cache: RangeCache, index: int, ranges=None) -> str:
    ranges = RANGES if ranges is None else ranges
    return os.path.join(cache.directory,
                        entry_name(PATH, *ranges[index], index, payload(index, ranges[index][1])))


def journal_names(directory) -> set[str]:
    """The entries the journal lists (its + lines less its - lines); whole lines only."""
    with open(os.path.join(directory, JOURNAL_NAME), 'rb') as f:
        data = f.read()
    assert data.endswith(b'\n'), data[-40:]
    names: dict[str, str] = {}
    for line in data.decode().splitlines()[1:]:
        assert ENTRY.match(line[1:]), line
        if line[0] == '+':
            names[line[1:25]] = line[1:]
        else:
            names.pop(line[1:25], None)
    return set(names.values())


def warnings_about(caplog, directory) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == 'loadr' and str(directory) in r.getMessage()]


class Mounts:
    """tmpfs mounts made by a test (as root), unmounted at its end."""

    def __init__(self):
        self.points: list[str] = []

    def tmpfs(self, path, size: str = '64k'):
        os.makedirs(path, exist_ok=True)
        why = None
        if shutil.which('mount') is None:
            why = 'no mount command'
        else:
            done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs',
                                   str(path)], capture_output=True, text=True)
            if done.returncode:
                why = (done.stderr.strip().splitlines() or ['refused'])[0]
        if why:
            pytest.skip(f'needs a tmpfs mount (root with CAP_SYS_ADMIN): {why}')
        self.points.append(str(path))
        return path

    def read_only(self, path) -> None:
        subprocess.run(['mount', '-o', 'remount,ro', str(path)], check=True,
                       capture_output=True)

    def close(self) -> None:
        for point in reversed(self.points):
            subprocess.run(['umount', '-l', point], capture_output=True)


@pytest.fixture
def mounts():
    made = Mounts()
    try:
        yield made
    finally:
        made.close()


def fill(directory) -> None:
    """Fill the filesystem of ``directory`` to the last byte."""
    fd = os.open(os.path.join(directory, 'filler'), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (b'\0' * 4096, b'\0'):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)


# -- NextUse -------------------------------------------------------------------


@pytest.mark.parametrize('n', [7, 100])
@pytest.mark.parametrize('shuffle', [True, False])
@pytest.mark.parametrize('version', [1, 2])
def test_next_use_equals_a_scan_of_the_stream(n, shuffle, version):
    order = Order(n, seed=11, shuffle=shuffle, version=version)
    next_use = NextUse(order)
    everything = list(range(n))
    for now in (0, 1, n // 2, n - 1, n, n + 1, n + n // 2, 2 * n - 1, 2 * n, 5 * n + 3, 3, 0):
        got = next_use(np.array(everything), now)
        assert got.dtype == np.int64
        assert got.tolist() == brute_next_use(order, everything, now), now
        # Each next use lies in this epoch or the next, and is read there.
        assert ((got >= now) & (got < (now // n + 2) * n)).all()
    # Only the last few epochs' inverses are kept.
    assert len(next_use._inverses) <= policy.EPOCHS_KEPT
    if not shuffle:
        assert not next_use._inverses


def test_next_use_of_indices_outside_the_dataset_is_never():
    next_use = NextUse(Order(10, seed=0))
    got = next_use([-1, 3, 10, 10**12], now=4)
    assert got[0] == got[2] == got[3] == NEVER
    assert got[1] == brute_next_use(Order(10, seed=0), [3], 4)[0]
    with pytest.raises(ValueError, match='now'):
        next_use([1], now=-1)


def test_next_use_pickles_as_its_order():
    next_use = NextUse(Order(50, seed=3))
    before = next_use(np.arange(50), now=70)
    copy = pickle.loads(pickle.dumps(next_use))
    assert not copy._inverses and len(pickle.dumps(next_use)) < 500
    assert copy(np.arange(50), now=70).tolist() == before.tolist()
    assert functools.partial(copy.__call__, now=70)(np.arange(50)).tolist() == before.tolist()


# -- the policies on a handmade example ------------------------------------------------

# Order(6, shuffle=False): position p reads index p % 6. Lengths of indices 0..5:
SIZES = [4, 4, 2, 4, 3, 1]
RANGES = layout(SIZES)


def replay(cache: RangeCache, order: Order) -> list:
    """The sequence of the example; the content after each step."""
    next_use = NextUse(order)
    steps = []

    def offer(indices, now):
        cache.offer([item(i, RANGES) for i in indices], functools.partial(next_use, now=now))
        assert entry_bytes(cache.directory) <= cache.max_bytes
        steps.append(cached_indices(cache.directory))

    offer([0, 1], now=2)            # positions 0, 1 read: 8 bytes fit
    offer([2, 3], now=4)            # 2, 3 read: 14 bytes do not
    offer([4, 5], now=6)            # 4, 5 read
    hits = [cache.get(PATH, *RANGES[i]) for i in (0, 1)]       # positions 6, 7
    offer([4], now=8)               # as if 4 were fetched again
    return steps, hits


def test_furthest_keeps_the_nearest_next_uses(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=10)
    steps, hits = replay(cache, Order(6, seed=0, shuffle=False))
    assert steps == [
        {0: 4, 1: 4},               # everything fits
        {0: 4, 1: 4, 2: 2},         # next uses 0:6 1:7 2:8 3:9; 3 is furthest, left out
        {0: 4, 1: 4, 2: 2},         # 4:10 and 5:11 come after every entry: not admitted
        {0: 4, 2: 2, 4: 3},         # at 8: 2:8 4:10 0:12 1:13; 1 is evicted for 4
    ]
    assert hits == [payload(0, 4), payload(1, 4)]
    assert cache.get(PATH, *RANGES[4]) == payload(4, 3)
    assert cache.get(PATH, *RANGES[1]) is None
    assert cache.stats() == {'hits': 3, 'misses': 1, 'bytes_hit': 11, 'admitted': 4,
                             'evicted': 1, 'bytes_admitted': 13, 'write_errors': 0,
                             'damaged': 0}
    assert not temp_files(cache.directory)


def test_lru_on_the_same_example_keeps_the_recent_ones(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=10, policy='lru')
    steps, hits = replay(cache, Order(6, seed=0, shuffle=False))
    assert steps == [
        {0: 4, 1: 4},
        {1: 4, 2: 2, 3: 4},         # the newcomers are admitted; 0, the oldest, goes
        {2: 2, 3: 4, 4: 3, 5: 1},   # then 1
        {2: 2, 3: 4, 4: 3, 5: 1},   # 4 is already there
    ]
    assert hits == [None, None]     # what furthest kept for positions 6 and 7 is gone
    assert cache.stats()['evicted'] == 2 and cache.stats()['admitted'] == 6


def test_lru_get_makes_an_entry_recent(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=8, policy='lru')
    cache.offer([item(0, RANGES), item(1, RANGES)])       # 0 older than 1
    assert cache.get(PATH, *RANGES[0]) == payload(0, 4)     # now 1 is older
    cache.offer([item(2, RANGES)])
    assert set(cached_indices(cache.directory)) == {0, 2}


def test_furthest_without_next_use_changes_nothing(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    cache.offer([item(0, RANGES)])
    assert cached_indices(cache.directory) == {}
    assert cache.stats()['admitted'] == 0


def test_what_is_not_admitted(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=10)
    next_use = functools.partial(NextUse(Order(6, seed=0)), now=0)
    cache.offer([(PATH, 0, 11, 0, b'x' * 11),               # larger than the cache
                 (PATH, 20, 3, None, b'abc'),                # no index
                 (PATH, 30, 3, 1, b'ab'),                    # data not of its length
                 (PATH, 40, 2, 2, b'ok'), (PATH, 40, 2, 2, b'ok')], next_use)
    assert cached_indices(cache.directory) == {2: 2}
    assert cache.has(PATH, 40, 2) and not cache.has(PATH, 30, 3)
    assert cache.get(PATH, 40, 2) == b'ok'
    assert cache.get(PATH, 40, 3) is None                   # another range, not cached


def test_an_entry_of_the_wrong_size_is_a_miss(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    cache.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    name = entry_name(PATH, *RANGES[0], 0, payload(0, RANGES[0][1]))
    with open(os.path.join(cache.directory, name), 'r+b') as f:
        f.truncate(2)
    assert cache.get(PATH, *RANGES[0]) is None
    assert not cache.has(PATH, *RANGES[0])
    assert cache.stats()['misses'] == 1


# -- checksums -------------------------------------------------------------------


@pytest.mark.parametrize('damage', ['flip', 'longer', 'shorter'])
def test_a_damaged_entry_is_a_miss_is_deleted_and_is_cached_again(tmp_path, damage):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    next_use = functools.partial(NextUse(Order(6, seed=0, shuffle=False)), now=0)
    cache.offer([item(0, RANGES), item(1, RANGES)], next_use)
    path = entry_path(cache, 0)
    with open(path, 'r+b') as f:
        if damage == 'flip':
            f.seek(2)
            byte = f.read(1)
            f.seek(2)
            f.write(bytes([byte[0] ^ 0x10]))
        elif damage == 'longer':
            f.seek(0, os.SEEK_END)
            f.write(b'x')
        else:
            f.truncate(3)
    other = RangeCache(cache.directory, max_bytes=100)     # another process, in effect
    assert other.has(PATH, *RANGES[0]) == (damage == 'flip')  # a stat: bytes unread
    assert other.get(PATH, *RANGES[0]) is None
    assert not os.path.exists(path) and os.path.basename(path) not in journal_names(
        cache.directory)
    assert other.stats()['damaged'] == 1 and other.stats()['misses'] == 1
    assert other.get(PATH, *RANGES[1]) == payload(1, 4)      # the others are untouched
    # Fetched again, it is cached again, whole.
    other.offer([item(0, RANGES)], next_use)
    assert cache.get(PATH, *RANGES[0]) == payload(0, 4)
    assert cached_indices(cache.directory) == {0: 4, 1: 4}
    assert os.path.basename(path) in journal_names(cache.directory)


def test_a_damaged_entry_written_again_meanwhile_is_not_deleted(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    next_use = functools.partial(NextUse(Order(6, seed=0, shuffle=False)), now=0)
    cache.offer([item(0, RANGES)], next_use)
    path = entry_path(cache, 0)
    with open(path, 'rb') as f:
        stale = os.fstat(f.fileno())
    # Another process replaced the file (evicted and admitted it again) after this
    # one read the damaged copy: the new file is not the one found damaged.
    os.rename(path, path + '.old')
    with open(path, 'wb') as f:
        f.write(payload(0, 4))
    cache._damaged(os.path.basename(path), stale)
    assert cache.get(PATH, *RANGES[0]) == payload(0, 4)
    os.unlink(path + '.old')


def test_a_version_1_directory_loses_its_unchecked_entries_only(tmp_path):
    directory = tmp_path / 'c'
    directory.mkdir()
    (directory / MARKER_NAME).write_text(json.dumps({'version': 1, 'created_dir': True}))
    key = entry_name(PATH, *RANGES[0], 0, b'')[:24]
    old = f'{key}-0-4'                                  # version 1: <key>-<index>-<length>
    (directory / old).write_bytes(b'abcX')              # no checksum: nothing tells it wrong
    (directory / JOURNAL_NAME).write_text(f'loadr-cache-journal 1 abc\n+{old}\n')
    (directory / 'notes.txt').write_text('theirs')
    cache = RangeCache(str(directory), max_bytes=100)
    assert cache.get(PATH, *RANGES[0]) is None
    assert sorted(os.listdir(directory)) == sorted([MARKER_NAME, LOCK_NAME, 'notes.txt'])
    assert json.loads((directory / MARKER_NAME).read_text()) == {'version': 2,
                                                                 'created_dir': True}
    cache.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    assert RangeCache(str(directory), max_bytes=100).get(PATH, *RANGES[0]) == payload(0, 4)
    # Another version still is refused.
    (tmp_path / 'v9').mkdir()
    (tmp_path / 'v9' / MARKER_NAME).write_text(json.dumps({'version': 9}))
    with pytest.raises(ConfigError, match='version'):
        RangeCache(str(tmp_path / 'v9'), max_bytes=100)


# -- a disk that refuses ----------------------------------------------------------


def test_a_lock_file_that_cannot_be_made_leaves_the_cache_read_only(tmp_path, caplog):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    next_use = functools.partial(NextUse(Order(6, seed=0, shuffle=False)), now=0)
    cache.offer([item(0, RANGES)], next_use)
    os.unlink(tmp_path / 'c' / LOCK_NAME)
    os.mkdir(tmp_path / 'c' / LOCK_NAME)        # in the way (root ignores a chmod)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        other = RangeCache(cache.directory, max_bytes=100)
        for _ in range(3):
            other.offer([item(1, RANGES), item(2, RANGES)], next_use)     # no error
        assert other.get(PATH, *RANGES[0]) == payload(0, 4)   # what is there still serves
        assert other.get(PATH, *RANGES[1]) is None
    assert not other.writable
    assert cached_indices(cache.directory) == {0: 4}
    (line,) = warnings_about(caplog, cache.directory)
    assert 'cannot be written' in line and 'uncached' in line


def test_a_read_only_directory_serves_only_what_verifies(tmp_path, caplog, mounts):
    directory = mounts.tmpfs(tmp_path / 'ro', size='1m')
    next_use = functools.partial(NextUse(Order(6, seed=0, shuffle=False)), now=0)
    RangeCache(str(directory), max_bytes=100).offer([item(i, RANGES) for i in range(4)],
                                                    next_use)
    cache = RangeCache(str(directory), max_bytes=100)
    with open(entry_path(cache, 1), 'r+b') as f:
        f.write(b'\xff')
    os.unlink(directory / JOURNAL_NAME)             # and no journal: the names tell
    os.unlink(directory / LOCK_NAME)
    mounts.read_only(directory)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        assert cache.get(PATH, *RANGES[0]) == payload(0, 4)
        assert cache.get(PATH, *RANGES[1]) is None                # damaged: not served
        assert os.path.exists(entry_path(cache, 1))               # nor can it be deleted
        assert not cache.has(PATH, *RANGES[1])                    # nor read again
        cache.offer([item(4, RANGES), item(5, RANGES)], next_use)
        cache.offer([item(4, RANGES)], next_use)
        assert cache.get(PATH, *RANGES[3]) == payload(3, 4)
        assert cache.get(PATH, *RANGES[4]) is None
    assert cache.stats()['hits'] == 2 and cache.stats()['damaged'] == 1
    (line,) = warnings_about(caplog, directory)
    assert 'Read-only file system' in line
    with pytest.raises(ResourceError, match='cannot clear') as err:
        cache.clear()
    assert str(directory) in str(err.value)


def test_a_read_only_version_1_directory_is_not_read(tmp_path, caplog, mounts):
    directory = mounts.tmpfs(tmp_path / 'ro', size='1m')
    (directory / MARKER_NAME).write_text(json.dumps({'version': 1}))
    key = entry_name(PATH, *RANGES[0], 0, b'')[:24]
    (directory / f'{key}-0-4').write_bytes(payload(0, 4))
    mounts.read_only(directory)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        cache = RangeCache(str(directory), max_bytes=100)
        assert cache.get(PATH, *RANGES[0]) is None
    (line,) = warnings_about(caplog, directory)
    assert 'cannot be used' in line


def test_a_cache_directory_that_cannot_be_made_is_no_cache(tmp_path, caplog, mounts):
    parent = mounts.tmpfs(tmp_path / 'ro', size='64k')
    mounts.read_only(parent)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        cache = RangeCache(str(parent / 'c'), max_bytes=100)
        cache.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
        assert cache.get(PATH, *RANGES[0]) is None
    assert len(warnings_about(caplog, parent / 'c')) == 1
    (file := tmp_path / 'a-file').write_text('')
    with pytest.raises(ConfigError, match='not a directory'):
        RangeCache(str(file), max_bytes=100)
    with pytest.raises(ConfigError, match='a parent is a file'):
        RangeCache(str(file / 'c'), max_bytes=100)


def test_a_full_disk_stops_the_offers_and_keeps_the_journal_whole(tmp_path, caplog, mounts):
    directory = mounts.tmpfs(tmp_path / 'full', size='64k')
    sizes = [300] * 400
    ranges = layout(sizes)
    order = Order(400, seed=0, shuffle=False)
    cache = RangeCache(str(directory / 'c'), max_bytes=10**6)
    cache.offer([item(i, ranges) for i in range(4)], functools.partial(NextUse(order), now=0))
    fill(directory)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        # 100 lines do not fit in the journal's last page: the append fails half way.
        cache.offer([item(i, ranges) for i in range(4, 104)],
                    functools.partial(NextUse(order), now=0))
        cache.offer([item(i, ranges) for i in range(104, 110)],
                    functools.partial(NextUse(order), now=0))
    assert len(warnings_about(caplog, directory / 'c')) == 1
    assert not cache.writable
    on_disk = {n for n in os.listdir(directory / 'c') if ENTRY.match(n)}
    assert journal_names(directory / 'c') >= on_disk        # never a file it does not list
    for i in range(4):
        assert cache.get(PATH, *ranges[i]) == payload(i, 300)
    # Room again: another process writes, and the entries follow the journal.
    os.unlink(directory / 'filler')
    again = RangeCache(str(directory / 'c'), max_bytes=10**6)
    again.offer([item(i, ranges) for i in range(4, 10)], functools.partial(NextUse(order), now=0))
    assert set(cached_indices(directory / 'c')) == set(range(10))   # a page each: 40 of 64 KiB
    assert journal_names(directory / 'c') == {n for n in os.listdir(directory / 'c')
                                              if ENTRY.match(n)}
    assert all(again.get(PATH, *ranges[i]) == payload(i, 300) for i in range(10))


def test_a_full_disk_while_writing_entries(tmp_path, caplog, mounts):
    directory = mounts.tmpfs(tmp_path / 'full', size='64k')
    sizes = [3000] * 40
    ranges = layout(sizes)
    cache = RangeCache(str(directory), max_bytes=10**6)
    next_use = functools.partial(NextUse(Order(40, seed=0, shuffle=False)), now=0)
    with caplog.at_level(logging.WARNING, logger='loadr'):
        for start in range(0, 40, 4):
            cache.offer([item(i, ranges) for i in range(start, start + 4)], next_use)
    assert len(warnings_about(caplog, directory)) == 1
    stats = cache.stats()
    assert stats['write_errors'] > 0 and 0 < stats['admitted'] < 40
    assert journal_names(directory) >= {n for n in os.listdir(directory) if ENTRY.match(n)}
    assert not temp_files(directory)
    for i, length in cached_indices(directory).items():
        assert cache.get(PATH, *ranges[i]) == payload(i, length)


def test_default_budget_is_a_share_of_the_free_disk(tmp_path, mounts):
    directory = mounts.tmpfs(tmp_path / 'm', size='1m')
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    assert default_budget(directory / 'a' / 'b') == int(0.1 * free)     # not made yet
    cache = RangeCache(str(directory / 'ds'), max_bytes=None)
    assert cache.max_bytes == int(0.1 * free)
    cache.offer([item(i, RANGES) for i in range(3)],
                functools.partial(NextUse(Order(6, seed=0)), now=0))
    # What the cache holds counts as free: a resumed run gets the same budget, about.
    st = os.statvfs(directory)
    held = sum(SIZES[:3])
    assert default_budget(directory) == int(0.1 * (st.f_bavail * st.f_frsize + held))
    assert 0 < default_budget(tmp_path) <= DEFAULT_CAP


def test_pickled_copy_shares_the_directory_not_the_counts(tmp_path):
    cache = RangeCache(str(tmp_path / 'c'), max_bytes=100)
    cache.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    assert cache.get(PATH, *RANGES[0]) is not None
    blob = pickle.dumps(cache)
    assert len(blob) < 300 and b'_view' not in blob
    copy = pickle.loads(blob)
    assert (copy.directory, copy.max_bytes, copy.policy) == (cache.directory, 100, 'furthest')
    assert copy.stats()['hits'] == 0
    assert copy.get(PATH, *RANGES[0]) == payload(0, 4)
    assert copy.stats()['hits'] == 1


# -- the directory ---------------------------------------------------------------


def test_a_non_empty_directory_without_the_marker_is_refused(tmp_path):
    directory = tmp_path / 'mine'
    directory.mkdir()
    (directory / 'thesis.tex').write_text('years of work')
    with pytest.raises(ConfigError) as info:
        RangeCache(str(directory), max_bytes=100)
    assert str(directory) in str(info.value) and MARKER_NAME in str(info.value)
    assert os.listdir(directory) == ['thesis.tex']


@pytest.mark.parametrize('policy', ['furthest', 'lru'])
def test_foreign_files_are_never_deleted(tmp_path, policy):
    directory = tmp_path / 'c'
    cache = RangeCache(str(directory), max_bytes=10, policy=policy)
    foreign = ['notes.txt', 'ABCDEF0123456789ABCDEF01-1-4',     # upper case: not our name
               '0123456789abcdef01234567-1', '.loadr-cache-other',
               '0123456789abcdef0123456789abcdef-9999999999999999999-4']   # past int64
    for name in foreign:
        (directory / name).write_bytes(b'theirs')
    order = Order(6, seed=0, shuffle=True)
    for now in range(1, 61):
        i = order.index_at(now - 1)
        cache.offer([item(i, RANGES)], functools.partial(NextUse(order), now=now))
    assert cache.stats()['evicted'] > 0
    cache.clear()
    assert sorted(os.listdir(directory)) == sorted(foreign)
    assert all((directory / n).read_bytes() == b'theirs' for n in foreign)


def test_clear_removes_what_it_made_and_the_directory_it_made(tmp_path):
    made = RangeCache(str(tmp_path / 'new' / 'c'), max_bytes=10)
    made.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    made.clear()
    assert not os.path.exists(tmp_path / 'new' / 'c') and os.path.isdir(tmp_path / 'new')
    adopted = tmp_path / 'empty'
    adopted.mkdir()
    cache = RangeCache(str(adopted), max_bytes=10)
    cache.offer([item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    assert cached_indices(adopted) == {0: 4}
    cache.clear()
    assert os.listdir(adopted) == []                # it was there before: it stays


def test_a_new_cache_on_the_directory_reuses_the_entries(tmp_path):
    directory = str(tmp_path / 'c')
    order = Order(6, seed=0, shuffle=False)
    first = RangeCache(directory, max_bytes=10)
    first.offer([item(0, RANGES), item(1, RANGES)], functools.partial(NextUse(order), now=2))
    again = RangeCache(directory, max_bytes=10)         # a resumed run
    assert again.get(PATH, *RANGES[1]) == payload(1, 4)
    # Its eviction sees the entries the other one made.
    again.offer([item(2, RANGES), item(3, RANGES)], functools.partial(NextUse(order), now=4))
    assert cached_indices(directory) == {0: 4, 1: 4, 2: 2}


def test_temporary_files_of_dead_processes_are_reclaimed(tmp_path):
    directory = tmp_path / 'c'
    RangeCache(str(directory), max_bytes=10).offer(
        [item(0, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    proc = multiprocessing.get_context('spawn').Process(target=int)
    proc.start()
    proc.join()
    dead = f'{TMP_PREFIX}{cachedir.host()}-{proc.pid}-0000abcd'
    alive = f'{TMP_PREFIX}{cachedir.host()}-{os.getppid()}-0000abcd'
    other_host = f'{TMP_PREFIX}elsewhere-{proc.pid}-0000abcd'
    for name in (dead, alive, other_host):
        (directory / name).write_bytes(b'half')
    cache = RangeCache(str(directory), max_bytes=10)      # another process, in effect
    cache.offer([item(2, RANGES)], functools.partial(NextUse(Order(6, seed=0)), now=0))
    left = os.listdir(directory)
    assert dead not in left and alive in left and other_host in left


def test_views_follow_each_other_through_the_journal(tmp_path, monkeypatch):
    # Three caches on one directory, as three processes would be; the journal
    # is rewritten at every change (JOURNAL_MIN_BYTES=0), the hardest case.
    monkeypatch.setattr(cache_module, 'JOURNAL_MIN_BYTES', 0)
    monkeypatch.setattr(cache_module, 'JOURNAL_GROWTH', 1)
    directory = str(tmp_path / 'c')
    sizes = np.random.default_rng(0).integers(1, 50, size=60)
    ranges = layout(sizes)
    order = Order(60, seed=5)
    caches = [RangeCache(directory, max_bytes=300) for _ in range(3)]
    next_use = NextUse(order)
    rng = np.random.default_rng(1)
    for step in range(60):
        cache = caches[step % 3]
        now = int(rng.integers(0, 180))
        batch = order.indices(now, 8).tolist()
        cache.offer([item(i, ranges) for i in batch], functools.partial(next_use, now=now + 8))
        for c in caches:
            for i in rng.choice(60, size=5).tolist():
                data = c.get(PATH, *ranges[i])
                assert data is None or data == payload(i, ranges[i][1])
        assert entry_bytes(directory) <= 300
    on_disk = {n for n in os.listdir(directory) if ENTRY.match(n)}
    for c in caches:
        c._follow()
        assert {n for n in c._view.names if n is not None} == on_disk
        assert c.bytes_used() == entry_bytes(directory)
    assert not temp_files(directory)


# -- a simulation: two epochs of a true shuffle -----------------------------------


def order_of(n: int) -> Order:
    return Order(n, seed=0, shuffle=True)


def simulate(directory: str, policy: str, sizes, epochs: int, batch: int = 64) -> list[int]:
    """Bytes fetched from 'remote' per epoch, reading through a cache of 5% of the bytes."""
    n = len(sizes)
    ranges = layout(sizes)
    capacity = int(0.05 * sum(sizes))
    cache = RangeCache(directory, max_bytes=capacity, policy=policy)
    order = order_of(n)
    next_use = NextUse(order)
    fetched = [0] * epochs
    for start in range(0, epochs * n, batch):
        count = min(batch, epochs * n - start)
        misses = []
        for position, i in enumerate(order.indices(start, count).tolist(), start):
            data = cache.get(PATH, *ranges[i])
            if data is None:
                fetched[position // n] += ranges[i][1]
                misses.append(item(i, ranges))
            else:
                assert data == payload(i, ranges[i][1])
        cache.offer(misses, functools.partial(next_use, now=start + count))
        assert entry_bytes(directory) <= capacity
    return fetched


def test_furthest_fetches_fewer_bytes_than_lru_in_the_second_epoch(tmp_path):
    sizes = np.random.default_rng(7).integers(200, 1800, size=2000)
    total, capacity = int(sizes.sum()), int(0.05 * sizes.sum())
    furthest = simulate(str(tmp_path / 'furthest'), 'furthest', sizes, epochs=2)
    lru = simulate(str(tmp_path / 'lru'), 'lru', sizes, epochs=2)
    print(f'\nepoch 1 bytes fetched of {total}: furthest {furthest[1]}, lru {lru[1]} '
          f'(ratio {furthest[1] / lru[1]:.3f}; cache {capacity})')
    assert furthest[0] == lru[0] == total           # nothing is read twice in epoch 0
    assert furthest[1] < lru[1]
    # Every hit of epoch 1 crossed the boundary in the cache: no policy saves more
    # than the cache's size, plus the epoch-0 records of the batch that straddles
    # the boundary (offered after that batch's epoch-1 reads, which freed their
    # entries' places). Furthest saves nearly all of it: at the boundary it holds
    # the ranges read first in epoch 1, short of one range that did not fit.
    straddle = int(sizes[order_of(2000).indices(2000 - 2000 % 64, 2000 % 64)].sum())
    assert lru[1] >= furthest[1] >= total - capacity - straddle
    assert furthest[1] <= total - capacity + int(sizes.max())


# -- several processes on one directory -------------------------------------------------


def _hammer(directory: str, policy: str, max_bytes: int, seed: int, rounds: int) -> None:
    """A worker: offers batches and reads, checking the bytes and the size under the lock."""
    sizes = np.random.default_rng(0).integers(100, 900, size=300)
    ranges = layout(sizes)
    order = Order(300, seed=2)
    cache = RangeCache(directory, max_bytes=max_bytes, policy=policy)
    next_use = NextUse(order)
    rng = np.random.default_rng(seed)
    now = seed * 150
    for _ in range(rounds):
        batch = order.indices(now, 16).tolist()
        misses = []
        for i in batch:
            data = cache.get(PATH, *ranges[i])
            if data is None:
                misses.append(item(i, ranges))
            elif data != payload(i, ranges[i][1]):
                raise AssertionError(f'wrong bytes for index {i}')
        now += 16
        cache.offer(misses, functools.partial(next_use, now=now))
        for i in rng.choice(300, size=8).tolist():  # reads racing the other's evictions
            data = cache.get(PATH, *ranges[i])
            if data is not None and data != payload(i, ranges[i][1]):
                raise AssertionError(f'wrong bytes for index {i}')
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            used = entry_bytes(directory)
        finally:
            os.close(fd)
        if used > max_bytes:
            raise AssertionError(f'{used} bytes of entries > {max_bytes}')


@pytest.mark.parametrize('policy', ['furthest', 'lru'])
def test_two_processes_share_a_directory(tmp_path, policy):
    directory = tmp_path / 'c'
    RangeCache(str(directory), max_bytes=6000)
    (directory / 'notes.txt').write_text('not the cache')
    ctx = multiprocessing.get_context('spawn')
    procs = [ctx.Process(target=_hammer, args=(str(directory), policy, 6000, seed, 120))
             for seed in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
    assert [p.exitcode for p in procs] == [0, 0]
    assert entry_bytes(directory) <= 6000 and entry_bytes(directory) > 0
    assert not temp_files(directory)
    assert (directory / 'notes.txt').read_text() == 'not the cache'
    # What is there is whole and right.
    sizes = np.random.default_rng(0).integers(100, 900, size=300)
    ranges = layout(sizes)
    for i, length in cached_indices(directory).items():
        assert ranges[i][1] == length
        assert RangeCache(str(directory), 6000).get(PATH, *ranges[i]) == payload(i, length)
