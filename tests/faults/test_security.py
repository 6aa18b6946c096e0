"""The trust boundaries of SECURITY.md, tested: private endpoints, no unpickling of strangers,
pickle only when named, and a guard over every deserialiser call in loadr's source."""

from __future__ import annotations

import ast
import io
import json
import os
import pathlib
import pickle
import shutil
import socket
import stat

import msgpack
import numpy as np
import pytest
import zmq
from PIL import Image

import loadr
from loadr.errors import DecodeError
from loadr.readers.bag import BagFileWriter, BagWriter
from loadr.workers import protocol
from loadr.workers.shm import SHM_DIR

from ..loader_helpers import batch_digest, stream_digests, trivial
from .helpers import segments

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOBODY = 65534


class Gadget:
    """Unpickling this creates ``path``: proof that something was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, 'w'))


def test_the_ipc_directory_and_the_segments_are_ours_alone():
    with loadr.Loader(trivial(20), batch=4, workers=1) as loader:
        next(iter(loader))
        info = os.stat(loader._pool._dir)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == os.geteuid()
        assert loader._pool.endpoint == f'ipc://{loader._pool._dir}/tasks'
        for name in segments():
            st = os.stat(os.path.join(SHM_DIR, name))
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to become another user; the 0700 '
                                              'mode checked above is what keeps others out')
def test_another_user_can_neither_connect_nor_read_the_batches():
    with loadr.Loader(trivial(20), batch=4, workers=1) as loader:
        next(iter(loader))
        path = loader._pool.endpoint[len('ipc://'):]
        segment = os.path.join(SHM_DIR, segments()[0])
        pid = os.fork()
        if pid == 0:                                  # the stranger: another uid, same machine
            code = 0
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                for attempt in (lambda: socket.socket(socket.AF_UNIX).connect(path),
                                lambda: os.listdir(os.path.dirname(path)),
                                lambda: open(segment, 'rb')):
                    try:
                        attempt()
                        code |= 1                     # it got in: fail
                    except PermissionError:
                        pass
            except BaseException:  # noqa: BLE001 - the exit code tells the parent
                code |= 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)


def test_messages_from_identities_the_pool_did_not_assign_are_never_unpickled(tmp_path):
    marker = tmp_path / 'unpickled'
    gadget = pickle.dumps(Gadget(marker))
    data = trivial(200)
    with loadr.Loader(data, batch=8, seed=2, workers=0) as ref:
        expected = stream_digests(ref, 40)
    ctx = zmq.Context()
    with loadr.Loader(data, batch=8, seed=2, workers=2) as loader:
        it = iter(loader)
        got = [next(it)]
        # A process that can reach the socket (root here; the 0700 directory stops anyone
        # else) poses as workers: a made-up name and the names the pool once used.
        intruders = []
        for identity in (b'intruder', b'w0.1', b'w1.2', b'w0.3'):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(loader._pool.endpoint)
            intruders.append(sock)
        for sock in intruders:
            sock.send_multipart(protocol.hello(os.getpid()))
            for task_id in range(64):                 # whatever task ids are in flight
                sock.send_multipart([protocol._pack(protocol.DONE, task_id), gadget])
                sock.send_multipart([protocol._pack(protocol.FAIL, task_id), gadget])
        got += [next(it) for _ in range(39)]
        for sock in intruders:
            sock.close(0)
    ctx.term()
    assert [batch_digest(b) for b in got] == expected
    assert not marker.exists()


def test_pickle_is_used_for_data_only_when_asked_for_by_name(tmp_path):
    marker = tmp_path / 'unpickled'
    path = tmp_path / 'x.ffr'
    with loadr.writers.FFRecordWriter(path, 1) as w:
        w.write_one(pickle.dumps(Gadget(marker)))
    assert loadr.open(path)[0]['data'][:1] == b'\x80'          # raw bytes by default
    for decode in ('msgpack', 'json'):
        with pytest.raises(DecodeError):
            loadr.open(path, decode=decode)[0]
    assert not marker.exists()
    loadr.open(path, decode='pickle')[0]                        # named: the user's call
    assert marker.exists()


def test_a_bag_array_of_dtype_object_is_refused_not_unpickled(tmp_path):
    marker = tmp_path / 'unpickled'
    out = tmp_path / 'bag'
    with BagWriter(out, {'a': 'array'}) as w:
        w.append({'a': np.zeros(1)})
    os.unlink(out / 'a.bag')
    with BagFileWriter(out / 'a.bag') as bag:
        bag.append(msgpack.packb(('|O', [1], pickle.dumps(Gadget(marker)))))
    with pytest.raises(DecodeError, match='dtype') as info:
        loadr.open(out)[0]
    assert (info.value.path, info.value.index) == (str(out / 'a.bag'), 0)
    assert not marker.exists()


def test_a_pickled_gmeta_is_refused_unless_allowed_and_then_restricted(fixtures, tmp_path):
    gulp = tmp_path / 'gulp'
    shutil.copytree(fixtures / 'gulp_pickle', gulp)
    os.chmod(gulp / 'meta_1.gmeta', 0o644)
    marker = tmp_path / 'unpickled'
    (gulp / 'meta_1.gmeta').write_bytes(pickle.dumps({'v': Gadget(marker)}, protocol=2))
    for allow in (False, True):
        with pytest.raises(loadr.errors.UnsafeFormatError):
            loadr.open(gulp, allow_pickle=allow)
    assert not marker.exists()


@pytest.mark.parametrize('fmt', ['EPS', 'TIFF', 'GIF'])
def test_an_image_value_is_decoded_only_as_jpeg_or_png(tmp_path, fmt):
    # Pillow picks a plugin by content: an EPS stored as 'jpg' would go to Ghostscript.
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, format=fmt)
    out = tmp_path / 'bag'
    with BagWriter(out, {'image': 'jpg'}) as w:
        w.append({'image': np.zeros((4, 4, 3), np.uint8)})
    os.unlink(out / 'image.bag')
    with BagFileWriter(out / 'image.bag') as bag:
        bag.append(buf.getvalue())
    with pytest.raises(DecodeError, match='not a JPEG or PNG') as info:
        loadr.open(out)[0]
    assert (info.value.path, info.value.index) == (str(out / 'image.bag'), 0)
    assert loadr.open(out, decode_images=False)[0]['image'] == buf.getvalue()


# -- a guard over the source: every deserialiser call is one SECURITY.md accounts for ------

UNSAFE_CALLS = {('pickle', 'loads'), ('pickle', 'load'), ('pickle', 'Unpickler'),
                ('dill', 'loads'), ('dill', 'load'), ('marshal', 'loads'), ('marshal', 'load'),
                ('yaml', 'load'), ('yaml', 'load_all'), ('yaml', 'unsafe_load'),
                ('yaml', 'full_load'), ('yaml', 'unsafe_load_all'), ('shelve', 'open')}
# (file, enclosing function or class, call): each is in SECURITY.md with why it is safe.
ALLOWED = {
    ('loadr/workers/pool.py', 'WorkerPool._receive', 'pickle.loads'),      # assigned peers only
    ('loadr/workers/protocol.py', 'Failure.capture', 'pickle.loads'),      # our own dumps
    ('loadr/workers/protocol.py', 'Failure.exception', 'pickle.loads'),    # from a worker
    ('loadr/readers/ffrecord/reader.py', 'FFRecordReader._decoded', 'pickle.loads'),  # 'pickle'
    ('loadr/readers/gulp/layout.py', '_GulpUnpickler', 'pickle.Unpickler'),  # allow_pickle
    ('loadr/shared.py', 'decode', 'pickle.loads'),          # the main process's own items
    ('loadr/readers/webdataset/reader.py', 'decode_member', 'pickle.loads'),  # allow_pickle
    ('loadr/workers/agent.py', '_read_config', 'dill.loads'),   # stdin from its starter
}


def _safe_loaders(tree) -> set:
    """Names of classes in this module that derive from yaml's SafeLoader or CSafeLoader,
    directly or through other such classes of the module."""
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    safe: set = set()
    while True:
        more = {node.name for node in classes if node.name not in safe and any(
            (isinstance(b, ast.Attribute) and b.attr in ('SafeLoader', 'CSafeLoader'))
            or (isinstance(b, ast.Name) and b.id in safe) for b in node.bases)}
        if not more:
            return safe
        safe |= more


def _unsafe_sites(path: pathlib.Path) -> set:
    tree = ast.parse(path.read_text(), str(path))
    safe = _safe_loaders(tree)
    rel = path.relative_to(ROOT).as_posix()
    found = set()

    def visit(node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f'{scope}.{node.name}' if scope else node.name
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Attribute) and base.attr == 'Unpickler':
                        found.add((rel, scope, 'pickle.Unpickler'))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ('eval', 'exec'):
                found.add((rel, scope, func.id))
            if isinstance(func, ast.Attribute):
                owner = func.value.attr if isinstance(func.value, ast.Attribute) else \
                    getattr(func.value, 'id', None)
                if (owner, func.attr) in UNSAFE_CALLS:
                    loader = next((k.value for k in node.keywords if k.arg == 'Loader'), None)
                    safe_yaml = owner == 'yaml' and func.attr == 'load' and (
                        (isinstance(loader, ast.Name) and loader.id in safe)
                        or (isinstance(loader, ast.Attribute)
                            and loader.attr in ('SafeLoader', 'CSafeLoader')))
                    if not safe_yaml:
                        found.add((rel, scope, f'{owner}.{func.attr}'))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, '')
    return found


def test_every_deserialiser_call_in_loadr_is_accounted_for():
    sites = set()
    for path in sorted((ROOT / 'loadr').rglob('*.py')):
        sites |= _unsafe_sites(path)
    assert sites == ALLOWED, ('a new pickle/yaml/eval call site: make it safe, or add it to '
                              'ALLOWED and to SECURITY.md with the reason it is safe')


# -- a state file is data: `loadr run --resume` never imports or calls what it names ----------

MARKER_MODULE = '''
import pathlib
pathlib.Path(__file__).with_name('imported').touch()


def mark(dp, seed=None):
    pathlib.Path(__file__).with_name('called').touch()
    return dp
'''


def _loadr(*args, cwd):
    import subprocess
    import sys
    return subprocess.run([sys.executable, '-m', 'loadr.cli', *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_a_state_file_never_imports_or_calls_what_its_overrides_name(tmp_path, local_data):
    (tmp_path / 'marker_mod.py').write_text(MARKER_MODULE)
    imported, called = tmp_path / 'imported', tmp_path / 'called'
    pipeline = tmp_path / 'p.yaml'
    pipeline.write_text(f'reader: {{path: {local_data / "bag"}}}\n'
                        f'fns: [{{select: [idx]}}]\n'
                        f'loader: {{batch: 3, workers: 0}}\n')
    code = 'fns=[{select: [idx]}, marker_mod:mark]'
    state = tmp_path / 'state.json'
    done = _loadr('run', pipeline, '-o', code, '--steps', 2, '--save-state', state, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert imported.exists() and called.exists()          # the user's own -o: code, run
    imported.unlink(), called.unlink()
    # Resumed without the -o: the state's copy of it is refused, and nothing is imported.
    done = _loadr('run', pipeline, '--resume', state, cwd=tmp_path)
    assert done.returncode == 2 and 'batches:' not in done.stdout
    assert 'names code' in done.stderr and 'pass it again' in done.stderr
    assert "marker_mod:mark" in done.stderr and 'without --resume' in done.stderr
    assert not imported.exists() and not called.exists()
    # A forged state: an import path (os:system in the wild), or unpickling, in its overrides.
    saved = json.loads(state.read_text())
    for forged in (['fns=[marker_mod:mark]'], ['reader.decode=marker_mod:mark'],
                   ["fns.0={'marker_mod:mark': {}}"], ['reader={path: x, allow_pickle: true}'],
                   ['reader.decode=pickle']):
        state.write_text(json.dumps({**saved, 'overrides': forged}))
        done = _loadr('run', pipeline, '--resume', state, cwd=tmp_path)
        assert done.returncode == 2 and 'names code' in done.stderr, (forged, done.stderr)
        assert not imported.exists() and not called.exists()
    # Given again on the command line, it is the user's: the run goes on, and the state
    # keeps the override once.
    state.write_text(json.dumps(saved))
    done = _loadr('run', pipeline, '--resume', state, '-o', code, '--steps', 4, '--save-state',
                  state, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert called.exists() and json.loads(state.read_text())['overrides'] == [code]


def test_the_pipeline_path_a_state_file_names_is_never_read(tmp_path, local_data):
    (tmp_path / 'marker_mod.py').write_text(MARKER_MODULE)
    pipeline, evil = tmp_path / 'p.yaml', tmp_path / 'evil.yaml'
    body = f'reader: {{path: {local_data / "bag"}}}\nloader: {{batch: 3, workers: 0}}\n'
    pipeline.write_text(body + 'fns: [{select: [idx]}]\n')
    evil.write_text(body + 'fns: [{select: [idx]}, marker_mod:mark]\n')
    state = tmp_path / 'state.json'
    assert _loadr('run', pipeline, '--steps', 1, '--save-state', state,
                  cwd=tmp_path).returncode == 0
    state.write_text(json.dumps({**json.loads(state.read_text()), 'config': str(evil)}))
    done = _loadr('run', '--resume', state, cwd=tmp_path)
    assert done.returncode == 2 and 'on the command line' in done.stderr
    assert str(evil) in done.stderr                  # named, to compare: never loaded
    done = _loadr('run', pipeline, '--resume', state, '--steps', 2, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f'saved with the pipeline {evil}' in done.stderr
    assert not (tmp_path / 'imported').exists()
