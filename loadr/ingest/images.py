"""Images: what one file is stored as (kept as it is, or encoded, each change listed),
and :func:`ingest_images` (``DIR/<label>/<image>`` into a bag or gulp dataset).

The encoding runs in the worker processes (:mod:`loadr.ingest.writer`).
"""

from __future__ import annotations

import io
import os

from ..codecs import JPEG_QUALITY, image_kind, image_problem
from ..errors import ConfigError, DecodeError
from .scan import check_empty, scan_images
from .writer import check_out, default_workers, write_records

INGEST_FORMATS = ('JPEG', 'PNG', 'BMP', 'GIF', 'WEBP', 'TIFF', 'PPM')   # Pillow's names


_EXPECTED = 'an image file of a format ingest reads (JPEG, PNG, BMP, GIF, WEBP, TIFF, PPM)'


def encode_frame(img, quality: int = JPEG_QUALITY) -> bytes:
    """An image (Pillow) as JPEG bytes at ``quality``."""
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


def shrunk_image(img, short_side: int | None, max_side: int | None = None):
    """The image shrunk to ``short_side`` and within ``max_side``; itself when small enough."""
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
    changes: list[str] = []
    notes: list[str] = []
    try:
        with Image.open(io.BytesIO(data), formats=_ingest_formats()) as opened:
            img: Image.Image = opened       # replaced below by each step's new image
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
            if scale is not None and fmt == 'JPEG' and not rotate:
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
                img = shrunk_image(img, short_side, max_side)
                changes.append(f'shrunk from {w}x{h} to {img.size[0]}x{img.size[1]}')
            encoded = encode_frame(img) if target == 'jpg' else _encode_png(img)
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


def _image_task(args):
    path, target, short_side, exif_transpose, max_side = args
    try:
        with open(path, 'rb') as f:
            return 'ok', image_bytes(f.read(), target, short_side, exif_transpose, max_side)
    except OSError as exc:
        return 'error', f'cannot read: {exc.strerror or exc}'
    except DecodeError as exc:
        return 'error', exc.message


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
    check_out(out, format)
    scan = scan_images(src)
    check_empty(scan, src, allow_empty)
    label2idx = {label: i for i, label in enumerate(scan.labels)}
    if progress is not None:
        progress.total = len(scan.items)
    paths = [os.path.join(src, rel) for rel, _ in scan.items]
    target = _stored_type(paths, image_type, format)
    jobs = [(path, target, short_side, exif_transpose, max_side) for path in paths]
    entries = [(path, rel, label, {'label': label})
               for path, (rel, label) in zip(paths, scan.items, strict=True)]
    summary = write_records(out, format, jobs, _image_task, default_workers(workers), entries,
                            label2idx, progress, skip_bad, videos_per_chunk, shardlen, video=False,
                            image_type=target)
    summary.update(image_type=target, ignored=scan.ignored, empty_labels=scan.empty)
    return summary
