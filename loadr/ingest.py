"""``loadr ingest``: folders of images or videos into a bag or gulp dataset.

- ``ingest_images(DIR, OUT)``: ``DIR/<label>/<image>``; the label is the
  folder, numbered as torchvision's ``ImageFolder`` numbers it (the class
  folders' names, sorted; an empty class folder is refused unless allowed).
  Bag spec ``{image: jpg|png, label: int, label_name: utf8, path: utf8}``;
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

Images are stored as they are where the stored type allows (a JPEG in a
``jpg`` key, a PNG in a ``png`` key; checked by decoding them once); other
images are encoded (JPEG quality 90, or lossless PNG) and video frames as
JPEG. ``short_side`` shrinks anything larger (JPEG draft mode makes that
cheap). Whatever is stored differently from the file (re-encoded, converted
from CMYK or a palette, alpha dropped, shrunk, rotated by EXIF), and every
file passed over, is listed in the summary; nothing changes silently. Files are read
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
from typing import NamedTuple

from .codecs import JPEG_QUALITY, image_kind, image_problem
from .errors import ConfigError, DecodeError, WriterError
from .jsonfiles import read_json

__all__ = ['IMAGE_EXTENSIONS', 'VIDEO_EXTENSIONS', 'NO_VIDEO_BACKEND', 'video_backend',
           'ImageScan', 'scan_images', 'find_images', 'find_videos', 'read_list', 'image_bytes',
           'image_jpeg', 'video_frames', 'ingest_images', 'ingest_videos', 'ingest_json']

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


class ImageScan(NamedTuple):
    """What :func:`scan_images` found: the images, the classes, and what it passed over."""

    items: list          # [(relative path, label), ...] in natural order within each class
    labels: list         # every class folder's name, sorted as torchvision's ImageFolder sorts
    empty: list          # class folders without a single image (ImageFolder refuses them)
    ignored: list        # relative paths of files and folders that are not taken, with why


def scan_images(root: str) -> ImageScan:
    """Every ``root/<label>/**/<image>``, every class folder, and what is not an image.

    Class folders are the visible (not dot-named) folders in ``root``; their
    names, sorted, number the labels 0, 1, ... exactly as torchvision's
    ``ImageFolder`` numbers them (it would also take dot-named folders).

    Example: ``scan_images('photos').labels`` gives ``['cat', 'dog']``.
    """
    if not os.path.isdir(root):
        raise ConfigError('not a directory', root)
    items, loose, ignored, labels, empty = [], [], [], [], []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        if name.startswith('.'):
            ignored.append(f'{name}{"/" if os.path.isdir(top) else ""} (hidden)')
        elif not os.path.isdir(top):
            (loose if name.lower().endswith(IMAGE_EXTENSIONS) else ignored).append(name)
            if not name.lower().endswith(IMAGE_EXTENSIONS):
                ignored[-1] += ' (not in a class folder)'
        else:
            labels.append(name)
    for label in sorted(labels, key=_natural):
        found = 0
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, label)):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, '/')
            ignored.extend(f'{rel_dir}/{d}/ (hidden)' for d in sorted(dirnames)
                           if d.startswith('.'))
            dirnames[:] = _visible(dirnames)
            for name in sorted(filenames, key=_natural):
                rel = f'{rel_dir}/{name}'
                if name.startswith('.'):
                    ignored.append(f'{rel} (hidden)')
                elif not name.lower().endswith(IMAGE_EXTENSIONS):
                    ignored.append(f'{rel} (not an image file by its extension)')
                else:
                    items.append((rel, label))
                    found += 1
        if not found:
            empty.append(label)
    if loose and not items:
        raise ConfigError(f'images lie directly in the folder ({loose[0]!r}, …); put each in '
                          f'a folder named after its label: DIR/<label>/<image>', root)
    ignored.extend(f'{name} (not in a class folder)' for name in loose)
    if not items:
        raise ConfigError(f'no images found (looked for DIR/<label>/<image> with an extension '
                          f'of {", ".join(IMAGE_EXTENSIONS)})', root)
    return ImageScan(items, sorted(labels), sorted(empty), ignored)


def find_images(root: str, allow_empty: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(relative path, label), ...], sorted labels)`` for ``root/<label>/**/<image>``.

    A class folder without images is refused, as torchvision's ImageFolder
    refuses it, unless ``allow_empty`` (its label keeps its number).

    Example: ``find_images('photos')`` gives
    ``([('cat/1.jpg', 'cat'), ('dog/7.png', 'dog')], ['cat', 'dog'])``.
    """
    scan = scan_images(root)
    _check_empty(scan, root, allow_empty)
    return scan.items, scan.labels


def _check_empty(scan: ImageScan, root: str, allow_empty: bool) -> None:
    if scan.empty and not allow_empty:
        names = ', '.join(repr(e) for e in scan.empty)
        raise ConfigError(f'class folder(s) without any image: {names} (torchvision\'s '
                          f'ImageFolder refuses them too); remove them, or allow them '
                          f'(--allow-empty, allow_empty=True) to keep every label number as '
                          f'ImageFolder(allow_empty=True) gives it', root)


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


def _shrink_scale(w: int, h: int, short_side: int | None, max_side: int | None = None
                  ) -> float | None:
    """The factor (< 1) that brings a ``w``×``h`` image to ``short_side`` (its short side)
    and within ``max_side`` (its long side), whichever shrinks more; None: small enough.

    >>> _shrink_scale(1600, 1200, None, 800), _shrink_scale(1600, 1200, 300, 800)
    (0.5, 0.25)
    >>> _shrink_scale(500, 375, 400, 800) is None
    True
    """
    scale = 1.0
    if short_side and min(w, h) > short_side:
        scale = short_side / min(w, h)
    if max_side and max(w, h) > max_side:
        scale = min(scale, max_side / max(w, h))
    return scale if scale < 1 else None


def _shrunk(img, short_side: int | None, max_side: int | None = None):
    from PIL import Image
    w, h = img.size
    scale = _shrink_scale(w, h, short_side, max_side)
    if scale is None:
        return img
    if short_side and min(w, h) > short_side and scale == short_side / min(w, h):
        # The short side exactly, the long one rounded: as before max_side existed.
        if w <= h:
            size = (short_side, max(1, round(h * short_side / w)))
        else:
            size = (max(1, round(w * short_side / h)), short_side)
    else:
        # The long side exactly max_side, the short one rounded (never 0).
        size = (max(1, min(max_side, round(w * scale))), max(1, min(max_side, round(h * scale))))
    return img.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)


def _ingest_formats() -> list[str]:
    # The Pillow plugins for IMAGE_EXTENSIONS that this Pillow has: only these
    # parse the files, whatever their bytes claim (no EPS through Ghostscript,
    # no PSD, ...).
    from PIL import Image
    Image.init()
    return [f for f in INGEST_FORMATS if f in Image.OPEN]


# Modes a stored file may keep: what decode_image gives back as a plain array.
_KEEP_MODES = {'jpg': ('RGB', 'L'), 'png': ('RGB', 'L', 'RGBA', 'I;16')}
EXIF_ORIENTATION = 0x0112


def _target_mode(img, target: str) -> str:
    """The mode an image that must be encoded is stored in (no alpha in a JPEG)."""
    alpha = img.mode in ('RGBA', 'LA', 'PA') or 'transparency' in img.info
    if target == 'png':
        if img.mode in _KEEP_MODES['png']:
            return img.mode
        if img.mode == '1':
            return 'L'
        return 'RGBA' if alpha else 'RGB'
    return 'L' if img.mode in ('1', 'L', 'LA', 'I', 'I;16') else 'RGB'


def image_bytes(data: bytes, target: str = 'jpg', short_side: int | None = None,
                exif_transpose: bool = False, max_side: int | None = None
                ) -> tuple[bytes, list[str], list[str]]:
    """``(stored bytes, changes, notes)`` for one image file's bytes.

    A JPEG (``target='jpg'``) or PNG (``target='png'``) in a mode that
    decodes to a plain array is stored as it is; anything else is encoded:
    as JPEG (quality 90) or as PNG (lossless). ``changes`` says, in words,
    each way the stored image differs from the file (re-encoded, converted
    from CMYK or a palette, alpha dropped, shrunk, rotated); ``notes`` what
    was left as it is but a user may not expect (an EXIF orientation not
    applied: the pixels are stored as the file has them, as torchvision's
    ImageFolder reads them; ``exif_transpose=True`` rotates them instead).
    ``short_side`` / ``max_side`` shrink an image whose short side / long side
    is larger (the stronger of the two wins), re-encoded once (JPEG quality 90,
    or PNG): every later epoch decodes fewer bytes.
    The image is fully decoded once, so a broken file fails here
    (DecodeError) rather than in training.

    >>> import numpy as np
    >>> from loadr.codecs import encode_image
    >>> png = encode_image(np.zeros((4, 4, 3), np.uint8), 'PNG')
    >>> image_bytes(png, 'jpg')[1]
    ['PNG stored as JPEG (quality 90)']
    >>> image_bytes(png, 'png')[0] == png
    True
    """
    from PIL import Image, ImageOps
    if target not in _KEEP_MODES:
        raise ConfigError(f"image type must be 'jpg' or 'png', got {target!r}")
    changes, notes = [], []
    try:
        with Image.open(io.BytesIO(data), formats=_ingest_formats()) as img:
            fmt, mode = img.format, img.mode
            w, h = img.size
            orientation = img.getexif().get(EXIF_ORIENTATION, 1) if fmt in (
                'JPEG', 'PNG', 'WEBP', 'TIFF') else 1
            rotate = exif_transpose and orientation not in (1, None)
            scale = _shrink_scale(w, h, short_side, max_side)
            needs_resize = scale is not None
            same = fmt == {'jpg': 'JPEG', 'png': 'PNG'}[target] and mode in _KEEP_MODES[target]
            if orientation not in (1, None) and not rotate:
                notes.append(f'EXIF orientation {orientation} not applied (pixels as stored)')
            if same and not needs_resize and not rotate:
                img.load()               # proves the whole file decodes
                return bytes(data), changes, notes
            if needs_resize and fmt == 'JPEG' and not rotate:
                img.draft('RGB', (max(1, int(w * scale)), max(1, int(h * scale))))
            new_mode = _target_mode(img, target)
            if rotate:
                img = ImageOps.exif_transpose(img)
                changes.append(f'rotated by its EXIF orientation {orientation}')
            if img.mode != new_mode:
                dropped = img.mode in ('RGBA', 'LA', 'PA') or 'transparency' in img.info
                changes.append(f'{img.mode} converted to {new_mode}' + (
                    ' (alpha dropped: JPEG has none)' if dropped and target == 'jpg' else ''))
                img = img.convert(new_mode)
            if needs_resize:
                img = _shrunk(img, short_side, max_side)
                changes.append(f'shrunk from {w}x{h} to {img.size[0]}x{img.size[1]}')
            encoded = _encode(img) if target == 'jpg' else _encode_png(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        problem = image_problem(data, exc, _EXPECTED, INGEST_FORMATS)
        raise DecodeError(f'cannot decode image: {problem}') from exc
    how = f'JPEG (quality {JPEG_QUALITY})' if target == 'jpg' else 'PNG (lossless)'
    if fmt == {'jpg': 'JPEG', 'png': 'PNG'}[target]:
        changes.append(f're-encoded as {how}')
    else:
        changes.append(f'{fmt} stored as {how}')
    return encoded, changes, notes


def _encode_png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format='PNG')
    return buf.getvalue()


def image_jpeg(data: bytes, short_side: int | None = None) -> bytes:
    """JPEG bytes for one image file's bytes: a JPEG as it is, anything else encoded.

    ``image_bytes(data, 'jpg', short_side)[0]``: what video frames are stored as.

    >>> import numpy as np
    >>> from loadr.codecs import encode_image
    >>> image_jpeg(encode_image(np.zeros((4, 4, 3), np.uint8), 'PNG'))[:2]
    b'\\xff\\xd8'
    """
    return image_bytes(data, 'jpg', short_side)[0]


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
    path, target, short_side, exif_transpose, max_side = args
    try:
        with open(path, 'rb') as f:
            return 'ok', image_bytes(f.read(), target, short_side, exif_transpose, max_side)
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
           videos_per_chunk, shardlen, video: bool, image_type: str = 'jpg') -> dict:
    """Run ``task`` over ``jobs`` and write each result with its ``entries`` row.

    An image task gives ``(bytes, changes, notes)``; they are collected per
    file for the summary.
    """
    from .writers import BagWriter, GulpWriter
    if fmt == 'bag':
        spec = ({'id': 'utf8', 'frames': 'jpg[]', 'label': 'int', 'meta': 'msgpack'} if video
                else {'image': image_type, 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'})
        writer = BagWriter(out, spec, shardlen=shardlen)
    else:
        writer = GulpWriter(out, videos_per_chunk=videos_per_chunk, label2idx=label2idx or None)
    written, skipped, changed, notes = 0, [], [], []
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
            if not video:
                value, its_changes, its_notes = value
                if its_changes:
                    changed.append((id_, its_changes))
                if its_notes:
                    notes.append((id_, its_notes))
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
            'labels': len(label2idx), 'changed': changed, 'notes': notes}


def _stored_type(paths: list, image_type: str, fmt: str) -> str:
    """'jpg' or 'png': what the bag's image key holds (gulp frames are always JPEG)."""
    if image_type not in ('auto', 'jpg', 'png'):
        raise ConfigError(f"image type must be 'auto', 'jpg' or 'png', got {image_type!r}")
    if fmt == 'gulp':
        if image_type == 'png':
            raise ConfigError('gulp stores JPEG frames only: leave out --image-type png, or '
                              'write a bag (--format bag)')
        return 'jpg'
    if image_type != 'auto':
        return image_type
    # Keep what can be kept: JPEG when there is any JPEG (re-encoding one would
    # lose detail), else PNG (the other formats convert to it without loss).
    for path in paths:
        try:
            with open(path, 'rb') as f:
                if image_kind(f.read(16)) == 'JPEG':
                    return 'jpg'
        except OSError:
            continue                    # reported when the file is read for real
    return 'png'


def ingest_images(src: str, out: str, format: str = 'bag', workers: int | None = None,  # noqa: A002
                  short_side: int | None = None, skip_bad: bool = False, progress=None,
                  shardlen: int | None = None, videos_per_chunk: int = 100,
                  image_type: str = 'auto', allow_empty: bool = False,
                  exif_transpose: bool = False, max_side: int | None = None) -> dict:
    """Write every ``src/<label>/<image>`` into a new bag (default) or gulp dataset at ``out``.

    Labels are numbered as torchvision's ``ImageFolder`` numbers them: the
    class folders' names, sorted. A class folder without images is refused
    (as ImageFolder refuses it) unless ``allow_empty``. ``image_type``: what
    the bag's ``image`` key holds: ``'auto'`` (JPEG when any file is a JPEG,
    else PNG), ``'jpg'`` or ``'png'``; files of that format are stored as
    they are, others encoded (JPEG quality 90, or lossless PNG). Nothing is
    changed silently: the summary lists each file stored differently from
    how it was, and every file passed over. ``max_side`` (off by default):
    an image whose long side is larger is stored shrunk to that long side,
    re-encoded once (JPEG quality 90, or PNG), as FFCV does: every epoch
    after decodes a smaller file. ``short_side`` likewise for the short side.

    Returns ``{'out', 'format', 'written', 'skipped', 'labels', 'image_type',
    'changed': [(path, [what changed])], 'notes': [(path, [note])],
    'ignored': [path (why)], 'empty_labels': [label]}``.

    Example::

        ingest_images('photos', 'data/photos', workers=4, short_side=256)
    """
    _check_out(out, format)
    scan = scan_images(src)
    _check_empty(scan, src, allow_empty)
    label2idx = {label: i for i, label in enumerate(scan.labels)}
    if progress is not None:
        progress.total = len(scan.items)
    paths = [os.path.join(src, rel) for rel, _ in scan.items]
    target = _stored_type(paths, image_type, format)
    jobs = [(path, target, short_side, exif_transpose, max_side) for path in paths]
    entries = [(path, rel, label, {'label': label})
               for path, (rel, label) in zip(paths, scan.items, strict=True)]
    summary = _write(out, format, jobs, _image_task, _default_workers(workers), entries,
                     label2idx, progress, skip_bad, videos_per_chunk, shardlen, video=False,
                     image_type=target)
    summary.update(image_type=target, ignored=scan.ignored, empty_labels=scan.empty)
    return summary


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
