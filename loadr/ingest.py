"""``loadr ingest``: folders of images or videos into a bag or gulp dataset.

- ``ingest_images(DIR, OUT)``: ``DIR/<label>/<image>``; the label is the
  folder. Bag spec ``{image: jpg, label: int, label_name: utf8, path: utf8}``;
  gulp: a one-frame video per image, id = the relative path, meta
  ``{label, label_idx}``, and ``label2idx.json``.
- ``ingest_videos(DIR, OUT)``: ``DIR/<label>/<video>``, a video being a
  video file or a folder of frame images.
- ``ingest_json(LIST.json, VIDEOS, OUT)``: the 20BN (Something-Something,
  Jester) list ``[{"id": ..., "label": ...}, ...]``; video ``VIDEOS/<id>/``
  (frame images) or ``VIDEOS/<id>.<ext>`` (a video file).

Videos become bag ``{id: utf8, frames: jpg[], label: int, meta: msgpack}``
or gulp videos with meta ``{label, label_idx, ...}`` and ``label2idx.json``
(label -1 / no ``label_idx`` for an unlabelled entry). Labels are numbered
in sorted order unless a mapping is given.

JPEG files are stored as they are (checked by decoding them once); other
images, and video frames, are encoded as JPEG (quality 90). ``short_side``
shrinks anything larger (JPEG draft mode makes that cheap). Files are read
and encoded in a process pool; the writer in this process keeps the order of
the sorted file list, so the output does not depend on the worker count. A
file that cannot be read stops the ingest (nothing is written) unless
``skip_bad``.

Video files are decoded with PyAV (``import av``) when it is installed, else
with an ``ffmpeg`` binary on PATH; with neither, a clear error says how to
get one. Folders of frames need neither.

Example::

    summary = ingest_images('photos', 'data/photos', format='bag', workers=4)
    summary = ingest_json('something-something-v2-train.json', 'videos', 'data/ssv2',
                          format='gulp', labels='something-something-v2-labels.json')
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import tempfile

from .codecs import JPEG_QUALITY, image_problem
from .errors import ConfigError, DecodeError, WriterError
from .jsonfiles import read_json

__all__ = ['IMAGE_EXTENSIONS', 'VIDEO_EXTENSIONS', 'NO_VIDEO_BACKEND', 'video_backend',
           'find_images', 'find_videos', 'read_list', 'image_jpeg', 'video_frames',
           'ingest_images', 'ingest_videos', 'ingest_json']

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff', '.ppm')
INGEST_FORMATS = ('JPEG', 'PNG', 'BMP', 'GIF', 'WEBP', 'TIFF', 'PPM')   # Pillow's names
VIDEO_EXTENSIONS = ('.mp4', '.webm', '.avi', '.mkv', '.mov', '.m4v', '.mpg', '.mpeg', '.ogv')
FFMPEG_TIMEOUT_S = 600
POOL_CHUNK = 4
_EXPECTED = 'an image file of a format ingest reads (JPEG, PNG, BMP, GIF, WEBP, TIFF, PPM)'

NO_VIDEO_BACKEND = (
    'reading video files needs PyAV or an ffmpeg binary, and neither was found. '
    "Install one: 'pip install av' (PyAV, which bundles FFmpeg), or an ffmpeg binary on PATH "
    "('apt-get install ffmpeg', 'conda install -c conda-forge ffmpeg', 'brew install ffmpeg'). "
    'Folders of JPEG frames need neither.')


# ---------------------------------------------------------------------------
# Finding the inputs


def _natural(name: str):
    """Sort key that puts frame_2 before frame_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


def _visible(names):
    return sorted((n for n in names if not n.startswith('.')), key=_natural)


def find_images(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(relative path, label), ...], sorted labels)`` for ``root/<label>/**/<image>``.

    >>> find_images('photos')          # doctest: +SKIP
    ([('cat/1.jpg', 'cat'), ('dog/7.png', 'dog')], ['cat', 'dog'])
    """
    if not os.path.isdir(root):
        raise ConfigError('not a directory', root)
    items, loose = [], []
    for label in _visible(os.listdir(root)):
        top = os.path.join(root, label)
        if not os.path.isdir(top):
            if label.lower().endswith(IMAGE_EXTENSIONS):
                loose.append(label)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = _visible(dirnames)
            for name in _visible(filenames):
                if name.lower().endswith(IMAGE_EXTENSIONS):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    items.append((rel.replace(os.sep, '/'), label))
    if loose and not items:
        raise ConfigError(f'images lie directly in the folder ({loose[0]!r}, …); put each in '
                          f'a folder named after its label: DIR/<label>/<image>', root)
    if not items:
        raise ConfigError(f'no images found (looked for DIR/<label>/<image> with an extension '
                          f'of {", ".join(IMAGE_EXTENSIONS)})', root)
    return items, sorted({label for _, label in items})


def _frame_files(folder: str) -> list[str]:
    return [os.path.join(folder, n) for n in _visible(os.listdir(folder))
            if n.lower().endswith(IMAGE_EXTENSIONS)]


def find_videos(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(relative path, label), ...], labels)`` for ``root/<label>/<video file or folder>``."""
    if not os.path.isdir(root):
        raise ConfigError('not a directory', root)
    items = []
    for label in _visible(os.listdir(root)):
        top = os.path.join(root, label)
        if not os.path.isdir(top):
            continue
        for name in _visible(os.listdir(top)):
            path = os.path.join(top, name)
            if os.path.isdir(path) or name.lower().endswith(VIDEO_EXTENSIONS):
                items.append((f'{label}/{name}', label))
    if not items:
        raise ConfigError(f'no videos found (looked for DIR/<label>/<video file> with an '
                          f'extension of {", ".join(VIDEO_EXTENSIONS)}, or DIR/<label>/<folder '
                          f'of frames>/)', root)
    return items, sorted({label for _, label in items})


def _load_labels(path: str) -> dict:
    table = read_json(path, 'the label list', dict, '{label: index}')
    out = {}
    for label, idx in table.items():
        # 20BN's labels files store the indices as strings ("0", "1", ...).
        if isinstance(idx, str) and idx.strip().lstrip('-').isdigit():
            idx = int(idx)
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ConfigError(f'label {label!r} maps to {idx!r}, not an int', path)
        out[label] = idx
    return out


def read_list(path: str, label_field: str = 'label') -> list[tuple[str, str | None, dict]]:
    """``[(id, label or None, meta), ...]`` from a 20BN-style JSON list.

    ``label_field='template'`` reads Something-Something's templates, with
    their ``[`` ``]`` removed as in its labels file.
    """
    entries = read_json(path, 'the list', list, 'of {"id": ..., "label": ...}')
    out, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get('id'), (str, int)) \
                or isinstance(entry.get('id'), bool):
            raise ConfigError(f'entry {i} must be an object with an "id" (string or int), '
                              f'got {entry!r:.80}', path)
        id_ = str(entry['id'])
        if id_ in seen:
            raise ConfigError(f'entry {i}: id {id_!r} appears twice', path)
        seen.add(id_)
        label = entry.get(label_field)
        if label is not None and not isinstance(label, str):
            label = str(label)
        if label is not None and label_field == 'template':
            label = label.replace('[', '').replace(']', '')
        meta = {k: v for k, v in entry.items() if k != 'id'}
        if label is not None:
            meta['label'] = label
        out.append((id_, label, meta))
    if not out:
        raise ConfigError('the list is empty', path)
    return out


def _find_video(videos: str, id_: str) -> str | None:
    folder = os.path.join(videos, id_)
    if os.path.isdir(folder):
        return folder
    for ext in VIDEO_EXTENSIONS:
        if os.path.isfile(folder + ext):
            return folder + ext
    return None


# ---------------------------------------------------------------------------
# Images and frames (these run in the worker processes)


def _encode(img, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format='JPEG', quality=quality)
    return buf.getvalue()


def _shrunk(img, short_side: int | None):
    from PIL import Image
    w, h = img.size
    if not short_side or min(w, h) <= short_side:
        return img
    if w <= h:
        size = (short_side, max(1, round(h * short_side / w)))
    else:
        size = (max(1, round(w * short_side / h)), short_side)
    return img.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)


def _ingest_formats() -> list[str]:
    # The Pillow plugins for IMAGE_EXTENSIONS that this Pillow has: only these
    # parse the files, whatever their bytes claim (no EPS through Ghostscript,
    # no PSD, ...).
    from PIL import Image
    Image.init()
    return [f for f in INGEST_FORMATS if f in Image.OPEN]


def image_jpeg(data: bytes, short_side: int | None = None) -> bytes:
    """JPEG bytes for one image file's bytes: a JPEG as it is, anything else encoded.

    The image is fully decoded once, so a broken file fails here (DecodeError)
    rather than in training.

    >>> image_jpeg(open('cat.png', 'rb').read())[:2]      # doctest: +SKIP
    b'\\xff\\xd8'
    """
    from PIL import Image
    try:
        with Image.open(io.BytesIO(data), formats=_ingest_formats()) as img:
            is_jpeg = img.format == 'JPEG' and img.mode in ('RGB', 'L')
            w, h = img.size
            needs_resize = bool(short_side) and min(w, h) > short_side
            if is_jpeg and not needs_resize:
                img.load()               # proves the whole file decodes
                return bytes(data)
            if needs_resize and img.format == 'JPEG':
                scale = short_side / min(w, h)
                img.draft('RGB', (max(1, int(w * scale)), max(1, int(h * scale))))
            img = img.convert('L' if img.mode in ('L', 'I;16', '1') else 'RGB')
            return _encode(_shrunk(img, short_side))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        problem = image_problem(data, exc, _EXPECTED, INGEST_FORMATS)
        raise DecodeError(f'cannot decode image: {problem}') from exc


def video_backend(prefer: str = 'auto') -> str | None:
    """``'pyav'``, ``'ffmpeg'`` or None: what can decode video files here."""
    if prefer not in ('auto', 'pyav', 'ffmpeg'):
        raise ConfigError(f"video backend must be 'auto', 'pyav' or 'ffmpeg', got {prefer!r}")
    if prefer in ('auto', 'pyav'):
        try:
            import av  # noqa: F401
            return 'pyav'
        except ImportError:
            if prefer == 'pyav':
                return None
    if shutil.which('ffmpeg'):
        return 'ffmpeg'
    return None


def _frames_pyav(path: str, fps: float | None, short_side: int | None) -> list[bytes]:
    import av
    out = []
    with av.open(path) as container:
        stream = container.streams.video[0]
        next_t = 0.0
        for frame in container.decode(stream):
            if fps:
                t = frame.time
                if t is not None and t + 1e-6 < next_t:
                    continue
                next_t += 1.0 / fps
            out.append(_encode(_shrunk(frame.to_image(), short_side)))
    return out


def _frames_ffmpeg(path: str, fps: float | None, short_side: int | None) -> list[bytes]:
    ffmpeg = shutil.which('ffmpeg')
    with tempfile.TemporaryDirectory(prefix='loadr-frames-') as tmp:
        cmd = [ffmpeg, '-nostdin', '-v', 'error', '-i', path]
        if fps:
            cmd += ['-vf', f'fps={fps}']
        cmd += ['-q:v', '2', os.path.join(tmp, '%06d.jpg')]
        done = subprocess.run(cmd, capture_output=True, timeout=FFMPEG_TIMEOUT_S, check=False)
        if done.returncode != 0:
            detail = done.stderr.decode('utf-8', 'replace').strip().splitlines()
            raise DecodeError(f'ffmpeg failed (exit {done.returncode}): '
                              f'{detail[-1] if detail else "no message"}', path)
        frames = []
        for name in _visible(os.listdir(tmp)):
            with open(os.path.join(tmp, name), 'rb') as f:
                frames.append(image_jpeg(f.read(), short_side))
        return frames


def video_frames(path: str, fps: float | None = None, short_side: int | None = None,
                 backend: str = 'auto') -> list[bytes]:
    """The frames of one video as JPEG bytes: a folder of frame images, or a video file.

    Example: ``video_frames('clips/jump/0001')`` (a folder of JPEGs).
    """
    if os.path.isdir(path):
        files = _frame_files(path)
        frames = []
        for file in files:
            with open(file, 'rb') as f:
                try:
                    frames.append(image_jpeg(f.read(), short_side))
                except DecodeError as exc:
                    raise DecodeError(exc.message, file) from exc
        return frames
    chosen = video_backend(backend)
    if chosen is None:
        raise ConfigError(NO_VIDEO_BACKEND, path)
    try:
        if chosen == 'pyav':
            return _frames_pyav(path, fps, short_side)
        return _frames_ffmpeg(path, fps, short_side)
    except DecodeError:
        raise
    except Exception as exc:    # noqa: BLE001 - PyAV raises its own error types
        raise DecodeError(f'cannot decode video ({chosen}): {type(exc).__name__}: {exc}',
                          path) from exc


def _image_task(args):
    path, short_side = args
    try:
        with open(path, 'rb') as f:
            return 'ok', image_jpeg(f.read(), short_side)
    except OSError as exc:
        return 'error', f'cannot read: {exc.strerror or exc}'
    except DecodeError as exc:
        return 'error', exc.message


def _video_task(args):
    path, fps, short_side, backend = args
    try:
        frames = video_frames(path, fps, short_side, backend)
    except OSError as exc:
        return 'error', f'cannot read: {exc.strerror or exc}'
    except (DecodeError, ConfigError) as exc:
        return 'error', exc.message
    if not frames:
        return 'error', 'no frames'
    return 'ok', frames


# ---------------------------------------------------------------------------
# The pool and the writers


def _ignore_sigint():
    # Ctrl-C belongs to the main process, which stops the pool in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _results(task, jobs: list, workers: int):
    """``task(job)`` for each job, in order, on ``workers`` processes (0 or 1: here)."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(task, jobs)
        return
    import multiprocess
    method = 'fork' if 'fork' in multiprocess.get_all_start_methods() else 'spawn'
    pool = multiprocess.get_context(method).Pool(workers, initializer=_ignore_sigint)
    try:
        yield from pool.imap(task, jobs, chunksize=POOL_CHUNK)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _check_out(out: str, fmt: str) -> None:
    if fmt not in ('bag', 'gulp'):
        raise ConfigError(f"--format must be 'bag' or 'gulp', got {fmt!r}")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ConfigError('the output already exists; remove it or pick another path', out)


def _default_workers(workers: int | None) -> int:
    return max(1, min(8, os.cpu_count() or 1)) if workers is None else int(workers)


def _write(out, fmt, jobs, task, workers, entries, label2idx, progress, skip_bad,
           videos_per_chunk, shardlen, video: bool) -> dict:
    """Run ``task`` over ``jobs`` and write each result with its ``entries`` row."""
    from .writers import BagWriter, GulpWriter
    if fmt == 'bag':
        spec = ({'id': 'utf8', 'frames': 'jpg[]', 'label': 'int', 'meta': 'msgpack'} if video
                else {'image': 'jpg', 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'})
        writer = BagWriter(out, spec, shardlen=shardlen)
    else:
        writer = GulpWriter(out, videos_per_chunk=videos_per_chunk, label2idx=label2idx or None)
    written, skipped = 0, []
    with writer:
        for (status, value), (source, id_, label, meta) in zip(
                _results(task, jobs, workers), entries, strict=True):
            if status != 'ok':
                if not skip_bad:
                    raise DecodeError(f'{value} (nothing was written; --skip-bad leaves such '
                                      f'files out)', source)
                skipped.append(f'{source}: {value}')
                if progress is not None:
                    progress.update(1)
                continue
            idx = label2idx.get(label, -1) if label is not None else -1
            if fmt == 'gulp':
                gulp_meta = dict(meta)
                if label is not None:
                    gulp_meta['label_idx'] = idx
                writer.append(id_, gulp_meta, value if video else [value])
            elif video:
                writer.append({'id': id_, 'frames': value, 'label': idx, 'meta': meta})
            else:
                writer.append({'image': value, 'label': idx, 'label_name': label, 'path': id_})
            written += 1
            if progress is not None:
                progress.update(1, samples=len(value) if video else 1)
        if written == 0:
            raise WriterError('every input was skipped; nothing written', out)
    return {'out': out, 'format': fmt, 'written': written, 'skipped': skipped,
            'labels': len(label2idx)}


def ingest_images(src: str, out: str, format: str = 'bag', workers: int | None = None,  # noqa: A002
                  short_side: int | None = None, skip_bad: bool = False, progress=None,
                  shardlen: int | None = None, videos_per_chunk: int = 100) -> dict:
    """Write every ``src/<label>/<image>`` into a new bag (default) or gulp dataset at ``out``.

    Returns ``{'out', 'format', 'written', 'skipped', 'labels'}``.

    Example::

        ingest_images('photos', 'data/photos', workers=4, short_side=256)
    """
    _check_out(out, format)
    items, labels = find_images(src)
    label2idx = {label: i for i, label in enumerate(labels)}
    if progress is not None:
        progress.total = len(items)
    jobs = [(os.path.join(src, rel), short_side) for rel, _ in items]
    entries = [(os.path.join(src, rel), rel, label, {'label': label}) for rel, label in items]
    return _write(out, format, jobs, _image_task, _default_workers(workers), entries, label2idx,
                  progress, skip_bad, videos_per_chunk, shardlen, video=False)


def _need_backend(paths: list, backend: str) -> None:
    files = [p for p in paths if not os.path.isdir(p)]
    if files and video_backend(backend) is None:
        raise ConfigError(f'{len(files)} of the videos are files (e.g. '
                          f'{os.path.basename(files[0])}): {NO_VIDEO_BACKEND}')


def ingest_videos(src: str, out: str, format: str = 'gulp',  # noqa: A002
                  workers: int | None = None, fps: float | None = None,
                  short_side: int | None = None, backend: str = 'auto',
                  skip_bad: bool = False, progress=None, shardlen: int | None = None,
                  videos_per_chunk: int = 100) -> dict:
    """Write every ``src/<label>/<video>`` (a file or a folder of frames) into ``out``.

    Example::

        ingest_videos('clips', 'data/clips', format='gulp', fps=8, short_side=128)
    """
    _check_out(out, format)
    items, labels = find_videos(src)
    label2idx = {label: i for i, label in enumerate(labels)}
    paths = [os.path.join(src, rel) for rel, _ in items]
    _need_backend(paths, backend)
    if progress is not None:
        progress.total = len(items)
    jobs = [(p, fps, short_side, backend) for p in paths]
    entries = []
    for path, (rel, label) in zip(paths, items, strict=True):
        id_ = rel if os.path.isdir(path) else os.path.splitext(rel)[0]
        entries.append((path, id_, label, {'label': label}))
    return _write(out, format, jobs, _video_task, _default_workers(workers), entries, label2idx,
                  progress, skip_bad, videos_per_chunk, shardlen, video=True)


def ingest_json(list_path: str, videos: str, out: str, format: str = 'gulp',  # noqa: A002
                workers: int | None = None, labels: str | dict | None = None,
                label_field: str = 'label', fps: float | None = None,
                short_side: int | None = None, backend: str = 'auto', skip_bad: bool = False,
                progress=None, shardlen: int | None = None, videos_per_chunk: int = 100) -> dict:
    """Write the videos of a 20BN-style list (``[{"id", "label"}, ...]``) into ``out``.

    ``labels`` is a ``{label: index}`` dict or JSON file (20BN's labels
    file, string indices accepted); default: the list's labels, sorted.

    Example::

        ingest_json('jester-train.json', '20bn-jester-v1', 'data/jester', format='gulp')
    """
    _check_out(out, format)
    if not os.path.isdir(videos):
        raise ConfigError('the videos folder does not exist', videos)
    entries_in = read_list(list_path, label_field)
    if isinstance(labels, (str, os.PathLike)):
        label2idx = _load_labels(os.fspath(labels))
    elif isinstance(labels, dict):
        label2idx = dict(labels)
    else:
        label2idx = {label: i for i, label in enumerate(
            sorted({lb for _, lb, _ in entries_in if lb is not None}))}
    unknown = sorted({lb for _, lb, _ in entries_in if lb is not None and lb not in label2idx})
    if unknown:
        raise ConfigError(f'{len(unknown)} label(s) of the list are not in the label mapping, '
                          f'e.g. {unknown[0]!r}', list_path)
    paths, missing = [], []
    for id_, _, _ in entries_in:
        path = _find_video(videos, id_)
        (missing.append(id_) if path is None else paths.append(path))
    if missing:
        raise ConfigError(f'{len(missing)} video(s) of the list are missing from the videos '
                          f'folder, e.g. id {missing[0]!r} (looked for a folder <id>/ or a file '
                          f'<id>{{{",".join(VIDEO_EXTENSIONS)}}})', videos)
    _need_backend(paths, backend)
    if progress is not None:
        progress.total = len(paths)
    jobs = [(p, fps, short_side, backend) for p in paths]
    entries = [(p, id_, label, meta)
               for p, (id_, label, meta) in zip(paths, entries_in, strict=True)]
    return _write(out, format, jobs, _video_task, _default_workers(workers), entries, label2idx,
                  progress, skip_bad, videos_per_chunk, shardlen, video=True)
