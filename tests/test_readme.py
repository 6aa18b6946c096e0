"""README's quickstart, run as written on a folder of photos of different sizes.

The shell lines of the quickstart run as commands, its Python blocks are
executed in order in one namespace, in a folder holding ``photos/``. The one
change: the training loop's ``range(1000)`` becomes ``range(STEPS)``.
"""

from __future__ import annotations

import io
import logging
import pathlib
import re
import shlex
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import loadr
from loadr.errors import SpecError

from .datasets import image_folder, jpeg

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = 5
TIMEOUT_S = 120


def quickstart_blocks(title: str = 'Quickstart') -> list[tuple[str, str]]:
    """``[(language, code), ...]`` of README's section ``title``, in order."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text.split(f'\n## {title}\n', 1)[1].split('\n## ', 1)[0]
    return re.findall(r'```(\w+)\n(.*?)```', section, flags=re.S)


def run_shell(code: str, cwd: pathlib.Path) -> None:
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == 'loadr', line
        done = subprocess.run([sys.executable, '-m', 'loadr.cli', *words[1:]], cwd=cwd,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, (line, done.stderr)


def test_the_quickstart_runs_on_photos_of_different_sizes(tmp_path, monkeypatch, capsys):
    image_folder(tmp_path / 'photos', sizes=((24, 32), (40, 30), (33, 33), (20, 50), (64, 48)))
    blocks = quickstart_blocks()
    assert [lang for lang, _ in blocks] == ['sh', 'python', 'python', 'python']
    monkeypatch.chdir(tmp_path)
    namespace: dict = {'__name__': '__readme__'}
    after: list[dict] = []
    for lang, code in blocks:
        if lang == 'sh':
            run_shell(code, tmp_path)
            continue
        assert code.count('range(1000)') <= 1
        exec(compile(code.replace('range(1000)', f'range({STEPS})'), 'README.md', 'exec'),
             namespace)
        after.append(dict(namespace))
    # The epochs block: each loader.epoch(e) ended (the block returned) after one pass, and
    # its batches are channels-first floats.
    chw = after[1]
    assert chw['epoch'] == 1 and chw['batch']['image'].dtype == np.float32
    assert chw['batch']['image'].shape == (len(chw['reader']), 3, 224, 224)
    with loadr.Loader(chw['reader'], batch=4, fns=chw['fns'], seed=0, workers=0) as loader:
        sizes = [len(b['label']) for b in loader.epoch(0)]
        assert sizes == [4, 4, 2] and loader.step == len(chw['reader'])
    batch, state, reader, fns = (after[0][k] for k in ('batch', 'state', 'reader', 'fns'))
    assert batch['image'].shape == (64, 224, 224, 3) and batch['label'].shape == (64,)
    assert state['step'] == STEPS * 64
    assert namespace['report'].ok
    # "exactly the batch that was due next": the next batch of one uninterrupted run.
    with loadr.Loader(reader, batch=64, fns=fns, shuffle=True, seed=0, workers=0) as loader:
        it = iter(loader)
        for _ in range(STEPS):
            next(it)
        due = next(it)
    assert np.array_equal(batch['image'], due['image'])
    assert np.array_equal(batch['label'], due['label'])
    assert 'cat' in capsys.readouterr().out           # the printed datapoint


def test_without_a_size_fn_the_shape_error_says_how_to_fix_it(tmp_path):
    image_folder(tmp_path / 'photos')
    run_shell('loadr ingest images photos/ data/photos', tmp_path)
    reader = loadr.open(tmp_path / 'data' / 'photos')
    with loadr.Loader(reader, batch=4, shuffle=False, workers=0) as loader:
        with pytest.raises(SpecError) as info:
            next(iter(loader))
    text = str(info.value)
    assert "key 'image' is uint8[40, 30, 3], the spec says uint8[24, 32, 3]" in text
    assert 'random_resized_crop(size=224)' in text and 'resize(size=(224, 224))' in text
    assert "spec={'image': (object, ())" in text
    # Following the hint's second way: a list of arrays of their own sizes.
    spec = {'image': (object, ()), 'label': ('int64', ()), 'label_name': (object, ()),
            'path': (object, ())}
    with loadr.Loader(reader, batch=4, shuffle=False, workers=0, spec=spec) as loader:
        batch = next(iter(loader))
    assert [a.shape for a in batch['image']] == [(24, 32, 3), (40, 30, 3), (33, 33, 3),
                                                 (20, 50, 3)]


def install_lines(text: str) -> list[list[str]]:
    """The words after each ``pip install`` in ``text`` (README lines, hints in the code)."""
    out = []
    for match in re.finditer(r"pip install ([^`\n\"]+)", text):
        try:
            out.append(shlex.split(match.group(1), comments=True))
        except ValueError:              # an unclosed quote: the line goes on in the source
            out.append(match.group(1).replace("'", ' ').split())
    return out


def test_no_install_line_fetches_the_unrelated_loadr_from_the_package_index():
    # "loadr" on the package index is somebody else's project: every
    # install line installs this one, from the checkout ('.', '.[s3]'), or packages by name.
    import tomllib
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    assert project['name'] == 'loadr-ml' and project['scripts'] == {'loadr': 'loadr.cli:main'}
    texts = {'README.md': (ROOT / 'README.md').read_text(encoding='utf-8')}
    texts.update({str(p.relative_to(ROOT)): p.read_text(encoding='utf-8')
                  for p in sorted((ROOT / 'loadr').rglob('*.py'))})
    seen = 0
    for name, text in texts.items():
        for words in install_lines(text):
            seen += 1
            for word in words:
                base = re.split(r'[\[<>=!~ ]', word, maxsplit=1)[0].lower()
                assert base != 'loadr', (name, words)
    assert seen >= 5
    readme = texts['README.md']
    assert "pip install -e '.[s3]'" in readme and 'pip install .  ' in readme
    assert 'pip install torch --index-url https://download.pytorch.org/whl/cpu' in readme


def write_tar_shard(path: pathlib.Path, n: int) -> None:
    """A WebDataset-style tar: ``000017.jpg`` beside ``000017.cls``."""
    path.parent.mkdir(parents=True)
    with tarfile.open(path, 'w') as tar:
        for i in range(n):
            for name, data in ((f'{i:06}.jpg', jpeg((80, 96, 3), seed=i)),
                               (f'{i:06}.cls', str(i % 3).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_your_own_data_runs_as_written(tmp_path, monkeypatch, caplog):
    # README's "Your own data": the len()/[i] protocol, a dataset that
    # opens its file once per process, tuples, and a BagWriter, run in order as written.
    write_tar_shard(tmp_path / 'shards' / 'train-000.tar', 40)
    blocks = quickstart_blocks('Your own data')
    assert [lang for lang, _ in blocks] == ['python', 'python', 'python']
    monkeypatch.chdir(tmp_path)
    namespace: dict = {'__name__': '__readme__'}
    with caplog.at_level(logging.WARNING, logger='loadr'):
        for _, code in blocks:
            exec(compile(code, 'README.md', 'exec'), namespace)
    assert namespace['batch']['image'].shape == (16, 64, 64, 3)
    assert namespace['batch']['label'].shape == (16,)
    x, y = namespace['x'], namespace['y']
    assert x.shape == (32, 8) and y.shape == (32,) and np.array_equal(y, x[:, 0] % 10)
    reader = namespace['reader']
    assert len(reader) == 40 and reader[7]['label'] == 7 % 3
    assert reader[7]['image'] == namespace['shard'][7]['image']
    # It opens its file once per process: nothing shared for the loader to warn about.
    assert not [r for r in caplog.records if 'opened before the workers' in r.getMessage()]
