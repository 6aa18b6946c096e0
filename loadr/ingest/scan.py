"""Finding ingest's inputs: images and videos in class folders, ``DIR/<label>/...``.

Everything is listed in natural order (``frame_2`` before ``frame_10``), so
what is written does not depend on the file system's order.
"""

from __future__ import annotations

import logging
import os
import re
from typing import NamedTuple

from ..errors import ConfigError

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff', '.ppm')


VIDEO_EXTENSIONS = ('.mp4', '.webm', '.avi', '.mkv', '.mov', '.m4v', '.mpg', '.mpeg', '.ogv')


def _natural(name: str):
    """Sort key that puts frame_2 before frame_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


def _real_dir(path: str) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the folder ``path`` leads to (links followed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def visible(names):
    """The names not hidden (no leading dot), in natural order (``2`` before ``10``)."""
    return sorted((n for n in names if not n.startswith('.')), key=_natural)


class ImageScan(NamedTuple):
    """What :func:`scan_images` found: the images, the classes, and what it passed over."""

    items: list          # [(relative path, label), ...] in natural order within each class
    labels: list         # every class folder's name, sorted as torchvision's ImageFolder sorts
    empty: list          # class folders without a single image (ImageFolder refuses them)
    ignored: list        # relative paths of files and folders that are not taken, with why


def scan_images(root: str) -> ImageScan:
    """Every ``root/<label>/**/<image>``, every class folder, and what is not an image.

    Class folders are all the folders in ``root``, dot-named ones included;
    their names, sorted, number the labels 0, 1, ... exactly as torchvision's
    ``ImageFolder`` numbers them (a warning names a dot-named class folder
    that holds images). Inside a class folder, dot-named files and folders
    are passed over.

    Example: ``scan_images('photos').labels`` gives ``['cat', 'dog']``.
    """
    if not os.path.isdir(root):
        raise ConfigError('not a directory', root)
    items: list = []
    loose: list[str] = []
    ignored: list[str] = []
    labels: list = []
    empty: list = []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        if name.startswith('.') and not os.path.isdir(top):
            ignored.append(f'{name} (hidden)')
        elif not os.path.isdir(top):
            (loose if name.lower().endswith(IMAGE_EXTENSIONS) else ignored).append(name)
            if not name.lower().endswith(IMAGE_EXTENSIONS):
                ignored[-1] += ' (not in a class folder)'
        else:
            labels.append(name)
    # Links to folders are followed, as the folder reader (loadr.readers.folder.scan) and
    # torchvision follow them, but one that leads back to a folder the walk is inside
    # (the root, or a folder on the way down) is not: a loop would list images for ever.
    root_dir = _real_dir(root)
    inside: dict[str, tuple] = {os.path.join(root, label): () if root_dir is None else (root_dir,)
                                for label in labels}
    for label in sorted(labels, key=_natural):
        found = 0
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, label),
                                                    followlinks=True):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, '/')
            real = _real_dir(dirpath)
            if real is not None and real in inside[dirpath]:
                ignored.append(f'{rel_dir}/ (a link back into a folder it lies in: a loop, '
                               f'not followed)')
                dirnames[:] = []
                continue
            ignored.extend(f'{rel_dir}/{d}/ (hidden)' for d in sorted(dirnames)
                           if d.startswith('.'))
            dirnames[:] = visible(dirnames)
            for d in dirnames:
                inside[os.path.join(dirpath, d)] = inside[dirpath] + (
                    (real,) if real is not None else ())
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
    hidden = sorted({label for label in labels if label.startswith('.')} - set(empty))
    if hidden:
        logging.getLogger('loadr').warning(
            'loadr: %s: dot-named folder(s) %s hold images: each is a class, as torchvision\'s '
            'ImageFolder takes it, and counts in the label numbers; move them out of the '
            'folder if they are not classes', root, ', '.join(map(repr, hidden)))
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
    check_empty(scan, root, allow_empty)
    return scan.items, scan.labels


def check_empty(scan: ImageScan, root: str, allow_empty: bool) -> None:
    """Refuse class folders without an image unless ``allow_empty``, as ImageFolder does."""
    if scan.empty and not allow_empty:
        names = ', '.join(repr(e) for e in scan.empty)
        raise ConfigError(f'class folder(s) without any image: {names} (torchvision\'s '
                          f'ImageFolder refuses them too); remove them, or allow them '
                          f'(--allow-empty, allow_empty=True) to keep every label number as '
                          f'ImageFolder(allow_empty=True) gives it', root)


def frame_files(folder: str) -> list[str]:
    """The image files of a video's frame folder, in natural order."""
    return [os.path.join(folder, n) for n in visible(os.listdir(folder))
            if n.lower().endswith(IMAGE_EXTENSIONS)]


def find_videos(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(relative path, label), ...], labels)`` for ``root/<label>/<video file or folder>``."""
    if not os.path.isdir(root):
        raise ConfigError('not a directory', root)
    items = []
    for label in visible(os.listdir(root)):
        top = os.path.join(root, label)
        if not os.path.isdir(top):
            continue
        for name in visible(os.listdir(top)):
            path = os.path.join(top, name)
            if os.path.isdir(path) or name.lower().endswith(VIDEO_EXTENSIONS):
                items.append((f'{label}/{name}', label))
    if not items:
        raise ConfigError(f'no videos found (looked for DIR/<label>/<video file> with an '
                          f'extension of {", ".join(VIDEO_EXTENSIONS)}, or DIR/<label>/<folder '
                          f'of frames>/)', root)
    return items, sorted({label for _, label in items})
