"""Videos: the frames of a video file (PyAV, else an ffmpeg binary) or of a folder of
frame images, as JPEG bytes, and :func:`ingest_videos` (``DIR/<label>/<video>``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ..errors import ConfigError, DecodeError
from .images import encode_frame, image_jpeg, shrunk_image
from .scan import find_videos, frame_files, visible
from .writer import check_out, default_workers, write_records

FFMPEG_TIMEOUT_S = 600


NO_VIDEO_BACKEND = (
    'reading video files needs PyAV or an ffmpeg binary, and neither was found. '
    "Install one: 'pip install av' (PyAV, which bundles FFmpeg), or an ffmpeg binary on PATH "
    "('apt-get install ffmpeg', 'conda install -c conda-forge ffmpeg', 'brew install ffmpeg'). "
    'Folders of JPEG frames need neither.')


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
            out.append(encode_frame(shrunk_image(frame.to_image(), short_side)))
    return out


def _frames_ffmpeg(path: str, fps: float | None, short_side: int | None) -> list[bytes]:
    ffmpeg = shutil.which('ffmpeg')
    if ffmpeg is None:      # (video_backend chose it because it was there)
        raise ConfigError(NO_VIDEO_BACKEND, path)
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
        for name in visible(os.listdir(tmp)):
            with open(os.path.join(tmp, name), 'rb') as f:
                frames.append(image_jpeg(f.read(), short_side))
        return frames


def video_frames(path: str, fps: float | None = None, short_side: int | None = None,
                 backend: str = 'auto') -> list[bytes]:
    """The frames of one video as JPEG bytes: a folder of frame images, or a video file.

    Example: ``video_frames('clips/jump/0001')`` (a folder of JPEGs).
    """
    if os.path.isdir(path):
        files = frame_files(path)
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


def video_task(args):
    """One video's frames as a worker task: ``('ok', frames)``, or ``('error', why)``."""
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


def need_backend(paths: list, backend: str) -> None:
    """Refuse video files (not frame folders) when no video backend is installed."""
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
    check_out(out, format)
    items, labels = find_videos(src)
    label2idx = {label: i for i, label in enumerate(labels)}
    paths = [os.path.join(src, rel) for rel, _ in items]
    need_backend(paths, backend)
    if progress is not None:
        progress.total = len(items)
    jobs = [(p, fps, short_side, backend) for p in paths]
    entries = []
    for path, (rel, label) in zip(paths, items, strict=True):
        id_ = rel if os.path.isdir(path) else os.path.splitext(rel)[0]
        entries.append((path, id_, label, {'label': label}))
    return write_records(out, format, jobs, video_task, default_workers(workers), entries,
                         label2idx, progress, skip_bad, videos_per_chunk, shardlen, video=True)
