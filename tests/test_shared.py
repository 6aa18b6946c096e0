"""loadr.shared: in-memory sources the workers read from one shared buffer.

Everything runs for real: forked and spawned workers, their memory read
from /proc, a main process SIGKILLed in its own process group.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal

import numpy as np
import pytest

import loadr
from loadr.shared import (
    SHARE_MIN_BYTES,
    SharedList,
    decode,
    encode_items,
    python_bytes,
    release,
    share,
)
from loadr.workers.memory import frozen_for_fork, private_bytes
from loadr.workers.shm import PREFIX, SHM_DIR

from .faults.helpers import (
    finish,
    kill_group,
    memfds,
    owned_dirs,
    read_json_line,
    start_script,
    wait_until_gone,
)
from .waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def boxes(n: int) -> list[dict]:
    """Small dicts as an annotation list holds them: a label, a name, a box (4 floats)."""
    return [{'label': i % 1000, 'name': f'img_{i:08d}.jpg', 'box': [i * 0.5, 2.0, 3.0, 4.0]}
            for i in range(n)]


def mixed(n: int) -> list[dict]:
    """Datapoints with an array, a numpy scalar, a tuple and a str: every kind the
    msgpack path stores, and a user's object that makes its datapoint go through pickle."""
    return [{'label': i, 'vec': np.full(3, i, np.float32), 'w': np.float32(i / 4),
             'pair': (i, str(i)), 'tag': Point(i) if i % 7 == 0 else None}
            for i in range(n)]


def same(a, b) -> bool:
    """Equal values of equal types, recursively; arrays with equal dtype, shape and bytes."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


class Point:
    """A user's own class: pickled."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Point and other.x == self.x


def test_every_kind_of_value_comes_back_the_same():
    items = [
        {'a': 1, 'b': 2.5, 'c': 'x', 'd': b'\x00\xff', 'e': None, 'f': True, 'g': [1, [2.0]]},
        (np.arange(6, dtype='>i4').reshape(2, 3), 7),           # a tuple datapoint
        {'scalar': np.float32(1.5), 'u8': np.uint8(255), 'i': np.int64(-3), 'b': np.bool_(1)},
        {'t': (1, (2, 'three')), 3: 'int key', 'nan': float('nan'), 'neg0': -0.0},
        {'empty': {}, 'arr0': np.array(5.0), 'f_order': np.asfortranarray(np.eye(3))},
        {},
        {'big': 2**70, 'pt': Point(3)},                         # pickled
        {'obj': np.array([1, 'a'], dtype=object)},               # pickled
        {'rec': np.zeros(2, dtype=[('x', 'i4'), ('y', 'f8')])},  # structured: pickled
        'not a dict', 12,
    ]
    shared = SharedList(items)
    try:
        assert len(shared) == len(items)
        for i, item in enumerate(items):
            got = shared[i]
            if i in (7, 8):
                key = 'obj' if i == 7 else 'rec'
                assert got[key].dtype == item[key].dtype
                assert got[key].tolist() == item[key].tolist()
                continue
            assert same(got, item), (i, got, item)
        assert shared[-1] == 12 and shared[1:3][0][1] == 7
        # Arrays come back writable, as the originals: a fn may change them in place.
        assert shared[1][0].flags.writeable
        with pytest.raises(IndexError):
            shared[len(items)]
    finally:
        shared.close()
    assert shared.closed


def test_a_pickle_and_an_empty_map_are_told_apart_without_a_tag():
    # A pickle starts with 0x80; so does msgpack's empty map, which is one byte.
    blobs = encode_items([{}, {'p': Point(1)}])
    assert blobs[0] == b'\x80' and blobs[1][0] == 0x80 and len(blobs[1]) > 1
    assert decode(blobs[0]) == {} and decode(blobs[1]) == {'p': Point(1)}


def test_an_item_that_cannot_be_serialised_is_named():
    with pytest.raises(loadr.LoadrError, match=r'\[index 1\]: the item cannot be serialised'):
        SharedList([{'x': 1}, {'f': lambda: 1}])


def test_a_pickled_shared_list_maps_the_same_buffer_and_fails_clearly_once_closed():
    shared = SharedList(boxes(100))
    copy = pickle.loads(pickle.dumps(shared))
    assert copy[42] == shared[42] == boxes(100)[42]
    late = pickle.loads(pickle.dumps(shared))
    shared.close()
    assert copy[3] == boxes(4)[3]           # mapped already: it keeps the memory
    with pytest.raises(loadr.LoadrError, match='SharedList is gone'):
        late[0]
    # The closed one itself says so (it read None as a path: a TypeError).
    with pytest.raises(loadr.LoadrError, match='this SharedList is closed'):
        shared[0]


def test_under_loadr_shm_devshm_the_buffer_has_no_name_in_dev_shm(monkeypatch):
    # A file in an owned /dev/shm directory, unlinked (and the directory removed) as
    # soon as it is open: another process maps it by /proc/<pid>/fd/<n>.
    monkeypatch.setenv('LOADR_SHM', 'devshm')
    before = (owned_dirs(), memfds())
    shared = SharedList(boxes(1000))
    try:
        assert (owned_dirs(), memfds()) == before
        assert os.readlink(shared._path).endswith('(deleted)')
        assert pickle.loads(pickle.dumps(shared))[999] == boxes(1000)[999]
    finally:
        shared.close()


def run(loader, batches: int):
    it = iter(loader)
    return [next(it) for _ in range(batches)]


def same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        list(x) == list(y) and all(
            (x[k].tobytes() == y[k].tobytes() and x[k].dtype == y[k].dtype
             and x[k].shape == y[k].shape) if isinstance(x[k], np.ndarray) else x[k] == y[k]
            for k in x)
        for x, y in zip(a, b))


@pytest.mark.parametrize('workers,method', [(0, None), (2, 'fork'), (2, 'spawn')])
def test_batches_are_the_same_with_and_without_sharing_across_a_resume(workers, method,
                                                                       monkeypatch):
    items = mixed(300)
    monkeypatch.setenv('LOADR_SHARE', '0')
    with loadr.Loader(items, batch=16, seed=3, workers=0) as plain:
        expected = run(plain, 8)
    monkeypatch.setenv('LOADR_SHARE', '1')         # shared, small as it is
    # workers=0 reads in this process, where nothing is copied: a SharedList given
    # by hand goes through the same reads.
    source = SharedList(items) if workers == 0 else items
    kw = {} if method is None else {'start_method': method}
    with loadr.Loader(source, batch=16, seed=3, workers=workers, **kw) as loader:
        first = run(loader, 4)
        state = loader.save()
        if workers:
            assert isinstance(loader._source, SharedList)
    # The state of a plain list and of its SharedList are one and the same.
    with loadr.Loader(items, batch=16, seed=3, workers=0) as plain:
        assert plain.save()['dataset'] == state['dataset']
    with loadr.Loader(source, batch=16, seed=3, workers=workers, **kw) as loader:
        loader.load(state)
        rest = run(loader, 4)
    assert same_batches(first + rest, expected)


def test_a_list_over_the_budget_is_used_as_it_is_with_a_warning_that_says_why(
        monkeypatch, caplog):
    items = boxes(5000)                     # ~170 KB serialised, over a 64 KiB budget
    monkeypatch.setenv('LOADR_SHARE', '1')
    monkeypatch.setenv('LOADR_SHM_BYTES', str(64 * 1024))
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(items, batch=4, seed=1, workers=1) as loader:
            got = run(loader, 3)
            assert loader._source is items
    text = caplog.text
    assert 'not shared with the workers' in text and 'budget of 0.1 MiB' in text \
        and 'LOADR_SHM_BYTES=65536' in text, text
    monkeypatch.delenv('LOADR_SHM_BYTES')
    with loadr.Loader(items, batch=4, seed=1, workers=0) as plain:
        assert same_batches(got, run(plain, 3))


def test_a_list_with_an_item_that_cannot_be_serialised_is_used_as_it_is(caplog, monkeypatch):
    monkeypatch.setenv('LOADR_SHARE', '1')
    items = [{'x': i, 'f': (lambda: 0) if i == 5 else None} for i in range(20)]
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(items, batch=4, fns=[without_f], seed=1, workers=1) as loader:
            assert len(run(loader, 5)) == 5 and loader._source is items
    assert '[index 5]: the item cannot be serialised' in caplog.text


def without_f(dp, seed):
    return {'x': dp['x']}


def test_a_list_is_shared_by_itself_once_its_objects_take_share_min_bytes(monkeypatch):
    monkeypatch.delenv('LOADR_SHARE', raising=False)
    small = boxes(1000)
    assert python_bytes(small) < SHARE_MIN_BYTES and share(small) is small
    big = boxes(1000) * 200                  # the same dicts: as large as they look
    assert python_bytes(big) >= SHARE_MIN_BYTES
    shared = share(big)
    try:
        assert isinstance(shared, SharedList) and shared[1500] == big[1500]
    finally:
        release(shared, big)
    assert shared.closed
    # Long bytes count one page each: a read copies the header's page, not the rest.
    jpegs = [{'jpeg': bytes(100_000), 'label': i} for i in range(1000)]
    assert python_bytes(jpegs) < 8 * 2**20 and share(jpegs) is jpegs
    monkeypatch.setenv('LOADR_SHARE', '1')
    release(forced := share(small), small)
    assert isinstance(forced, SharedList)
    monkeypatch.setenv('LOADR_SHARE', '0')
    assert share(big) is big
    assert share(range(10)) == range(10)      # not a list: its [i] may read files


def _uss_after_epoch(loader) -> list[int]:
    it = loader.epoch(0)
    next(it)
    start = [private_bytes(pid) for pid in loader.worker_pids]
    for _ in it:
        pass
    return [private_bytes(pid) - s for pid, s in zip(loader.worker_pids, start)]


def test_a_workers_memory_stays_flat_over_an_epoch_of_a_big_list(monkeypatch):
    # Measured on 150,000 small dicts (~70 MiB of Python objects), 2 forked workers:
    # each grew ~40 MiB over a shuffled epoch when it read the list itself (the
    # pages of the items it touched were copied), ~1 MiB reading the shared copy.
    items = boxes(150_000)
    monkeypatch.setenv('LOADR_SHARE', '1')
    with loadr.Loader(items, batch=512, seed=0, workers=2, start_method='fork') as loader:
        grew = _uss_after_epoch(loader)
        assert isinstance(loader._source, SharedList)
        stats = loader.stats()
    assert all(g < 12 * 2**20 for g in grew), [g / 2**20 for g in grew]
    # stats() reports each worker's private memory.
    assert all(w['uss_bytes'] > 0 for w in stats.workers), stats.workers
    assert 'worker private memory (USS)' in loadr.stats.format_table(stats)
    assert stats.since(stats).workers[0]['uss_bytes'] == stats.workers[0]['uss_bytes']



class Rows:
    """A user's own source (not a list): read as it is, never serialised."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def halved(dp, seed):
    """A Mix source's own fn: the datapoints it reads go through the source's chain."""
    return {**dp, 'w': np.float32(dp['w'] / 2)}


def mix_of_lists() -> loadr.Mix:
    """A Mix of a list, a tuple inside a nested Mix, and a reader that is not shared."""
    inner = loadr.Mix({'t': tuple(mixed(120)), 'r': Rows(mixed(50))}, source_key=None)
    return loadr.Mix({'a': mixed(300), 'inner': inner}, weights={'a': 0.7, 'inner': 0.3},
                     fns={'a': [halved]})


@pytest.mark.parametrize('workers,method', [(0, None), (2, 'fork'), (2, 'spawn')])
def test_a_mix_of_lists_gives_the_same_batches_with_and_without_sharing_across_a_resume(
        workers, method, monkeypatch):
    monkeypatch.setenv('LOADR_SHARE', '0')
    with loadr.Loader(mix_of_lists(), batch=16, seed=3, workers=0) as plain:
        expected = run(plain, 8)
        plain_state = plain.save()
    monkeypatch.setenv('LOADR_SHARE', '1')         # shared, small as they are
    mix = mix_of_lists()
    # workers=0 reads in this process (nothing is shared): the shared Mix given by hand
    # goes through the same reads.
    source = mix.shared() if workers == 0 else mix
    kw = {} if method is None else {'start_method': method}
    try:
        with loadr.Loader(source, batch=16, seed=3, workers=workers, **kw) as loader:
            first = run(loader, 4)
            state = loader.save()
            if workers:
                made = loader._source
                assert made is not mix and type(mix.sources['a']) is list
                assert isinstance(made.sources['a'], SharedList)
                assert isinstance(made.sources['inner'].sources['t'], SharedList)
                lists = [made.sources['a'], made.sources['inner'].sources['t']]
        if workers:
            assert all(s.closed for s in lists)         # given back at close
            assert type(mix.sources['inner'].sources['t']) is tuple
        # The state (and fingerprint) of the Mix of lists and of its shared copy are one.
        assert state['dataset'] == plain_state['dataset']
        with loadr.Loader(source, batch=16, seed=3, workers=workers, **kw) as loader:
            loader.load(state)
            rest = run(loader, 4)
    finally:
        if source is not mix:
            mix.release_shared(source)
    assert same_batches(first + rest, expected)


def test_a_mix_with_nothing_to_share_is_itself(monkeypatch):
    monkeypatch.delenv('LOADR_SHARE', raising=False)
    mix = loadr.Mix({'a': boxes(100), 'b': tuple(boxes(10)), 'r': Rows(boxes(5))})
    assert mix.shared() is mix and share(mix) is mix    # small lists: not shared by size
    monkeypatch.setenv('LOADR_SHARE', '1')
    shared = share(mix)
    assert shared is not mix and shared.sources['r'] is mix.sources['r']
    assert [shared[i] for i in range(115)] == [mix[i] for i in range(115)]
    assert shared.identity() == mix.identity()
    release(shared, mix)
    assert shared.sources['a'].closed and shared.sources['b'].closed
    monkeypatch.setenv('LOADR_SHARE', '0')
    assert share(mix) is mix


def test_a_workers_memory_stays_flat_over_an_epoch_of_a_big_list_inside_a_mix(monkeypatch):
    # Measured with 150,000 small dicts in a Mix beside a small list, 2 forked workers:
    # each grew ~37 MiB over a shuffled epoch when the Mix's list was read as it is,
    # ~2 MiB reading the shared copy.
    monkeypatch.setenv('LOADR_SHARE', '1')
    mix = loadr.Mix({'big': boxes(150_000), 'small': boxes(1000)}, source_key=None)
    with loadr.Loader(mix, batch=512, seed=0, workers=2, start_method='fork') as loader:
        grew = _uss_after_epoch(loader)
        assert isinstance(loader._source.sources['big'], SharedList)
    assert all(g < 12 * 2**20 for g in grew), [g / 2**20 for g in grew]

def collects(dp, seed):
    """A fn that runs a full garbage collection (some libraries do) once a batch."""
    if dp['label'] % 64 == 0:
        gc.collect()
    return dp


def test_a_full_collection_in_a_forked_worker_does_not_copy_the_main_processs_objects():
    # The collector visits every tracked object a forked worker inherited and writes
    # its header: 200,000 dicts held by the main process (not the source) were copied
    # into each worker, ~36 MiB, by one gc.collect(). Frozen across the fork: ~0.
    # (What a worker holds after the epoch, not its growth: the first batch collects.)
    held = boxes(200_000)
    with loadr.Loader([{'label': i} for i in range(2048)], batch=256, fns=[collects], seed=0,
                      workers=2, start_method='fork') as loader:
        for _ in loader.epoch(0):
            pass
        uss = [private_bytes(pid) for pid in loader.worker_pids]
    assert all(u < 20 * 2**20 for u in uss), [u / 2**20 for u in uss]
    assert gc.get_freeze_count() == 0       # the main process's collector is as it was
    del held


def test_the_parent_gets_its_collector_back_and_a_users_own_freeze_is_left_alone():
    if gc.get_freeze_count():
        pytest.skip('this process froze objects before the test')
    with frozen_for_fork(True):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with frozen_for_fork(False):
        assert gc.get_freeze_count() == 0
    gc.freeze()                             # the user's own
    try:
        frozen = gc.get_freeze_count()
        _ = [[] for _ in range(100)]
        with frozen_for_fork(True):
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


KILLED = '''
    import json, os, sys
    import loadr
    items = [{'label': i, 'name': str(i)} for i in range(20000)]
    with loadr.Loader(items, batch=8, seed=1, workers=2, start_method=sys.argv[1]) as loader:
        it = iter(loader)
        next(it)
        print(json.dumps({'pid': os.getpid(), 'workers': loader.worker_pids,
                          'shared': type(loader._source).__name__}), flush=True)
        while True:
            next(it)
'''


def ours(pids) -> list:
    """Names in /dev/shm that loadr made for these processes (other sessions make their own)."""
    return [name for name in os.listdir(SHM_DIR)
            if any(name.startswith(f'{PREFIX}{pid}-') for pid in pids)]


@pytest.mark.parametrize('method,backend', [('fork', 'memfd'), ('fork', 'devshm'),
                                            ('spawn', 'memfd')])
def test_sigkill_of_the_main_process_leaves_nothing_in_dev_shm(method, backend):
    env = {'LOADR_SHARE': '1', **({'LOADR_SHM': 'devshm'} if backend == 'devshm' else {})}
    proc = start_script(KILLED, method, env=env)
    try:
        info = read_json_line(proc)
        assert info['shared'] == 'SharedList'
        if backend == 'memfd':
            assert any('shared-list' in os.readlink(p) for p in memfds(info['pid']))
        os.kill(info['pid'], signal.SIGKILL)
        finish(proc)
        wait_until_gone(info['workers'])
        everyone = [info['pid'], *info['workers']]
        wait_until(lambda: owned_dirs(info['pid']) == [] and ours(everyone) == [],
                   lambda: f"{owned_dirs(info['pid']) + ours(everyone)} to be removed")
    finally:
        kill_group(proc)


def one_byte_and_odd_arrays() -> dict:
    """Arrays of every dtype kind and layout a datapoint may hold, 1-byte dtypes first
    (their dtype str starts with '|')."""
    big = np.arange(12, dtype='>f8').reshape(3, 4)
    return {
        'u8': np.arange(250, 256, dtype=np.uint8).reshape(2, 3),
        'i8': np.array([-128, -1, 0, 127], np.int8),
        'bool': np.array([True, False, True]),
        'S': np.array([b'ab', b'\x00c', b''], 'S2'),
        'U': np.array(['ä', 'bc'], 'U2'),
        'V': np.frombuffer(b'\x01\x02\x03\x04\x05\x06\x07\x08', 'V4').copy(),
        'rec': np.array([(1, 2.5, b'x')], [('a', 'u1'), ('b', '>f4'), ('c', 'S1')]),
        'zero_d': np.array(7, np.uint8),
        'zero_d_S': np.array(b'xyz'),
        'empty': np.zeros((0, 3), np.uint8),
        'empty_S': np.zeros(0, 'S4'),
        'strided': np.arange(40, dtype=np.uint8).reshape(5, 8)[::2, 1::3],
        'f_order': np.asfortranarray(np.arange(6, dtype=np.int8).reshape(2, 3)),
        'big_endian': big[:, ::2],
        'u8_scalar': np.uint8(200), 'bool_scalar': np.bool_(True), 'S_scalar': np.bytes_(b'q'),
    }


def test_arrays_of_one_byte_dtypes_and_odd_layouts_come_back_bitwise():
    # Every 1-byte dtype ('|u1', '|b1', '|S2' ...) raised "data type '' not understood".
    plain = {k: v for k, v in one_byte_and_odd_arrays().items() if k != 'rec'}
    items = [one_byte_and_odd_arrays(), np.zeros((4, 4, 3), np.uint8),
             (np.ones(2, bool), b'x'), np.array([1, 2], np.int8), plain]
    # The structured array's datapoint is pickled; the rest are msgpack.
    assert [blob[0] == 0x80 for blob in encode_items(items)] == [True] + [False] * 4
    shared = SharedList(items)
    try:
        for i, item in enumerate(items):
            assert same(shared[i], item), i
        got = shared[0]
        for key, value in items[0].items():
            if isinstance(value, np.ndarray):
                assert got[key].dtype == value.dtype and got[key].flags.writeable, key
        # And through a pickled copy, as a spawned worker reads it.
        copy = pickle.loads(pickle.dumps(shared))
        assert same(copy[0], items[0]) and same(copy[2], items[2])
    finally:
        shared.close()


def images(n: int) -> list[dict]:
    """uint8 images with 1-byte labels and masks: the common list that is shared by size."""
    rng = np.random.default_rng(5)
    return [{'image': rng.integers(0, 256, (6, 5, 3), np.uint8), 'label': np.int8(i % 7 - 3),
             'mask': rng.integers(0, 2, (6, 5)).astype(bool), 'name': np.array(f'{i}', 'S8')}
            for i in range(n)]


@pytest.mark.parametrize('workers', [0, 2])
def test_a_loader_over_a_shared_list_of_uint8_images_gives_the_unshared_batches(
        workers, monkeypatch, caplog):
    items = images(100)
    monkeypatch.setenv('LOADR_SHARE', '0')
    with loadr.Loader(items, batch=8, seed=2, workers=0) as plain:
        expected = run(plain, 15)           # past the epoch's end
    monkeypatch.setenv('LOADR_SHARE', '1')
    source = SharedList(items) if workers == 0 else items
    with caplog.at_level(logging.WARNING, logger='loadr'):
        with loadr.Loader(source, batch=8, seed=2, workers=workers, on_error='skip') as loader:
            got = run(loader, 15)
            assert isinstance(loader._source if workers else source, SharedList)
    assert 'skip' not in caplog.text.lower(), caplog.text
    assert same_batches(got, expected)


def edits_in_place(dp, seed):
    """A fn that changes its datapoint's buffers in place, as it may with its own copy."""
    dp['buf'][0] = 255
    dp['view'][1] = 0
    return {'buf': np.frombuffer(bytes(dp['buf']), np.uint8),
            'view': np.frombuffer(dp['view'].tobytes(), np.int32),
            'kinds': np.array([type(dp['buf']) is bytearray, dp['view'].readonly,
                               dp['ro'].readonly, dp['view'].format == 'i'])}


def buffers(n: int) -> list[dict]:
    return [{'buf': bytearray(bytes(range(i, i + 4))),
             'view': memoryview(bytearray(np.arange(i, i + 3, dtype=np.int32).tobytes())).cast('i'),
             'ro': memoryview(b'read only')} for i in range(n)]


def test_a_bytearray_and_a_memoryview_come_back_as_what_they_were():
    items = buffers(3)
    items.append({'nested': [(bytearray(b'ab'), {'m': memoryview(bytearray(6)).cast('B', [2, 3])})],
                  'keys': {memoryview(b'k'): 1}})
    shared = SharedList(items)
    try:
        got = shared[1]
        assert type(got['buf']) is bytearray and got['buf'] == items[1]['buf']
        view = got['view']
        assert type(view) is memoryview and not view.readonly and view.format == 'i'
        assert view.tolist() == [1, 2, 3]
        view[0] = 9                     # writable, as the original; the shared copy is not touched
        assert shared[1]['view'].tolist() == [1, 2, 3]
        assert got['ro'].readonly and got['ro'].tobytes() == b'read only'
        nested = shared[3]['nested'][0]
        assert type(nested) is tuple and type(nested[0]) is bytearray
        assert nested[1]['m'].shape == (2, 3) and nested[1]['m'].format == 'B'
        assert [bytes(k) for k in shared[3]['keys']] == [b'k']
    finally:
        shared.close()


@pytest.mark.parametrize('workers', [0, 2])
def test_a_fn_that_edits_buffers_in_place_gives_the_same_batches_shared_or_not(
        workers, monkeypatch):
    monkeypatch.setenv('LOADR_SHARE', '0')
    with loadr.Loader(buffers(40), batch=4, fns=[edits_in_place], seed=1, workers=workers,
                      start_method='fork') as plain:
        expected = run(plain, 12)
    monkeypatch.setenv('LOADR_SHARE', '1')
    items = buffers(40)
    source = SharedList(items) if workers == 0 else items
    with loadr.Loader(source, batch=4, fns=[edits_in_place], seed=1, workers=workers,
                      start_method='fork') as loader:
        got = run(loader, 12)
        assert isinstance(loader._source if workers else source, SharedList)
    assert same_batches(got, expected)
    assert expected[0]['kinds'][0].tolist() == [True, False, True, True]


def test_a_memoryview_of_a_format_it_cannot_rebuild_makes_the_list_unshared(monkeypatch, caplog):
    monkeypatch.setenv('LOADR_SHARE', '1')
    items = [{'v': memoryview(np.arange(3, dtype='>i4'))} for _ in range(4)]
    with pytest.raises(loadr.LoadrError, match=r'\[index 0\]: the item cannot be serialised'):
        SharedList(items)
