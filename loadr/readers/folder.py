"""Image folders read in place: ``photos/<class>/<image>``, labelled as ``loadr ingest`` labels.

The classes are the folders directly in the root, dot-named ones included,
numbered 0, 1, … in sorted order: torchvision's ``ImageFolder`` numbering
(a warning names a dot-named class folder that holds images), and exactly
what ``loadr ingest images`` gives (an empty class folder keeps its
number). The images are the files under each class folder, at any depth,
whose extension is one of :data:`loadr.ingest.IMAGE_EXTENSIONS` and whose
name and folders below the class folder are not dot-named, in the order
ingest takes them (each folder's files in natural order, then its
sub-folders). Links to folders are followed, but not one that loops back
into a folder it lies in. Nothing is copied or converted.

A datapoint is ``ingest``'s, so the same pipeline reads both::

    {'image': the file's bytes, 'label': int, 'label_name': str, 'path': 'cat/001.jpg'}

(the bytes of ``image`` as the file holds them, for ``decode_jpeg`` and the
other image fns; a JPEG or PNG there is what ``ingest`` would store as it
is). The listing is made once, when the reader is made, through the storage
layer, so a URL of a server that lists its folders (nginx's autoindex, S3)
works as a local path does; it travels with the reader to the workers.

Example::

    r = loadr.open('photos')
    r[0]['label'], r.classes          # 0, ['cat', 'dog']
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from ..errors import ConfigError, FormatError, LoadrError, SpecError, WriterError
from ..storage import storage_for
from .base import Format, Problem, Reader, Writer, check_index

__all__ = ['ImageFolderReader', 'FORMAT', 'check', 'detect', 'scan']

log = logging.getLogger('loadr')

# ingest's extensions and order (imported lazily there: ingest imports readers).
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp', '.tif', '.tiff', '.ppm')
KEYS = ('image', 'label', 'label_name', 'path')
# Folders looked into by detect() before it decides there are no images.
DETECT_FOLDERS = 3


def _natural(name: str):
    import re
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


def _join(root: str, name: str) -> str:
    return f'{root.rstrip("/")}/{name}' if '://' in root else os.path.join(root, name)


def _real_dir(storage, path: str):
    """``(st_dev, st_ino)`` of the directory ``path`` leads to; None behind a URL (no links)."""
    if storage.remote:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def scan(storage, root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, [(relative path, label), ...])`` of the folder at ``root``, as ingest has them.

    The classes are every folder in ``root``, dot-named ones included, in
    sorted order: torchvision's ``ImageFolder`` numbering (its
    ``find_classes``), whatever a label counts. A warning names the
    dot-named class folders that hold images (a ``.ipynb_checkpoints``
    among them is a class in ``ImageFolder`` too). Inside a class folder,
    dot-named files and folders are passed over, as ingest passes them over.

    Links to folders are followed, except one that leads back to a folder
    the walk is inside (the root or one of the folders on the way down): a
    loop, which would list the same images again and again. A warning names
    it; the images it leads to are listed once, where they are.

    A FormatError names the root when it holds no images.
    """
    try:
        names = storage.list(root)
    except LoadrError as exc:
        raise FormatError(f'cannot list the folder: {exc.message}', root) from exc
    classes = sorted(n for n in names if storage.isdir(_join(root, n)))
    items: list[tuple[str, int]] = []
    loops: list[str] = []
    top = _real_dir(storage, root)

    def walk(rel: str, label: int, inside: tuple) -> None:
        here = _join(root, rel)
        real = _real_dir(storage, here)
        if real is not None and real in inside:
            loops.append(rel)
            return
        inside = inside + (real,) if real is not None else inside
        entries = [n for n in storage.list(here) if not n.startswith('.')]
        dirs = [n for n in entries if storage.isdir(_join(here, n))]
        files = [n for n in entries if n not in dirs]
        for name in sorted(files, key=_natural):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                items.append((f'{rel}/{name}', label))
        for name in sorted(dirs, key=_natural):
            walk(f'{rel}/{name}', label, inside)

    # ingest walks the classes in natural order; the labels are numbered in sorted order.
    number = {name: k for k, name in enumerate(classes)}
    for name in sorted(classes, key=_natural):
        walk(name, number[name], (top,) if top is not None else ())
    if loops:
        log.warning('loadr: %s: %d folder link(s) lead back into a folder they lie in (a loop), '
                    'not followed (their images are listed once, where they are): %s', root,
                    len(loops), ', '.join(f'{rel} -> {os.path.realpath(_join(root, rel))}'
                                          for rel in loops[:5]))
    hidden = sorted({name for name in classes if name.startswith('.')}
                    & {rel.split('/', 1)[0] for rel, _ in items})
    if hidden:
        log.warning('loadr: %s: dot-named folder(s) %s hold images: each is a class, as '
                    'torchvision\'s ImageFolder takes it, and counts in the label numbers (%s); '
                    'move them out of the folder if they are not classes', root,
                    ', '.join(map(repr, hidden)),
                    ', '.join(f'{name!r} is label {number[name]}' for name in hidden))
    if not items:
        raise FormatError(f'no images found (looked for DIR/<class>/<image> with an extension '
                          f'of {", ".join(IMAGE_EXTENSIONS)})', root)
    return classes, items


class ImageFolderReader(Reader):
    """``root/<class>/<image>`` as a dataset; see the module docstring.

    ``allow_empty`` accepts class folders without images (refused otherwise,
    as ``ImageFolder`` and ``ingest`` refuse them). ``storage_options`` go to
    the storage of a URL.
    """

    format_name = 'imagefolder'

    def __init__(self, path: str | os.PathLike, allow_empty: bool = False,
                 storage_options: dict | None = None):
        self.path = os.fspath(path)
        self._files = storage_for(self.path, storage_options)
        self.classes, items = scan(self._files, self.path)
        empty = sorted(set(self.classes) - {self.classes[label] for _, label in items})
        if empty and not allow_empty:
            dot = (' (a dot-named folder is a class there too)'
                   if any(name.startswith('.') for name in empty) else '')
            raise ConfigError(f'class folder(s) without any image: '
                              f'{", ".join(map(repr, empty))} (torchvision\'s ImageFolder '
                              f'refuses them too{dot}); remove them, or pass allow_empty=True '
                              f'to keep every label number', self.path)
        self.paths = [rel for rel, _ in items]
        self.labels = [label for _, label in items]

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def label2idx(self) -> dict:
        """``{class name: label}``."""
        return {name: k for k, name in enumerate(self.classes)}

    def _datapoint(self, i: int, data: bytes) -> dict:
        label = self.labels[i]
        return {'image': data, 'label': label, 'label_name': self.classes[label],
                'path': self.paths[i]}

    def _file(self, i: int) -> str:
        return _join(self.path, self.paths[i])

    def where(self, index: int) -> str | None:
        """The image file of datapoint ``index``."""
        return self._file(check_index(index, len(self.paths)))

    def _get(self, index: int, mask: dict | None) -> dict:
        if mask is not None:
            unknown = [k for k, v in mask.items() if v is not False and k not in KEYS]
            if unknown:
                raise SpecError(f"no key {unknown[0]!r} (keys: {list(KEYS)})", self.path,
                                 index)
            if any(v not in (True, False) for v in mask.values()):
                raise TypeError('mask values must be True or False: image folders have no '
                                'sequence keys')
            wanted = [k for k in KEYS if mask.get(k) is True]
            if 'image' not in wanted:
                dp = self._datapoint(index, b'')
                return {k: dp[k] for k in wanted}
            dp = self._get(index, None)
            return {k: dp[k] for k in wanted}
        return self._datapoint(index, self._files.read_all(self._file(index), index))

    def read_batch(self, indices) -> list[dict]:
        """The datapoints of ``indices``; behind a URL, the files are fetched together."""
        wanted = [check_index(i, len(self)) for i in indices]
        if not self._files.remote:
            return [self._get(i, None) for i in wanted]
        ranges = [(self._file(i), 0, self._files.size(self._file(i), i), i) for i in wanted]
        return [self._datapoint(i, data)
                for i, data in zip(wanted, self._files.read_many(ranges))]

    def _ranges(self, indices: list[int]) -> list[tuple]:
        return [(self._file(i), 0, self._files.size(self._file(i), i), i) for i in indices]

    def available(self, index: int) -> dict:
        check_index(index, len(self))
        return {k: True for k in KEYS}

    @property
    def spec(self) -> dict:
        """``{'image': 'bytes', 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'}``."""
        return {'image': 'bytes', 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'}

    def details(self) -> dict:
        return {'classes': len(self.classes)}

    def identity(self) -> dict:
        """Format, datapoints, and a hash of the file names and labels (no file is stat'ed)."""
        listing = json.dumps([self.classes, self.paths], separators=(',', ':')).encode()
        return {'format': self.format_name, 'datapoints': len(self),
                'classes': len(self.classes),
                'files_sha256': hashlib.sha256(listing).hexdigest()}


class ImageFolderWriter(Writer):
    """Image folders are read in place only; ``loadr convert`` writes other formats."""

    format_name = 'imagefolder'

    @classmethod
    def plan(cls, plan, dst, types, **options):
        raise ConfigError('image folders are read in place, not written: convert to bag, '
                          'webdataset or ffrecord', dst)

    def __init__(self, *args, **kwargs):
        raise WriterError('image folders are read in place, not written')


def detect(path, storage_options=None) -> bool:
    """True for a directory whose class folders hold image files; never raises."""
    try:
        path = os.fspath(path)
        storage = storage_for(path, storage_options)
        if not storage.isdir(path):
            return False
        looked = 0
        for name in storage.list(path):
            folder = _join(path, name)
            if name.startswith('.') or not storage.isdir(folder):
                continue
            if any(n.lower().endswith(IMAGE_EXTENSIONS) for n in storage.list(folder)):
                return True
            looked += 1
            if looked >= DETECT_FOLDERS:
                return False
    except Exception:       # detection never raises, whatever the path is
        return False
    return False


def check(path, storage_options=None) -> list[Problem]:
    """Every image file read and decoded whole; each problem names the file and its index.
    ``storage_options``: the settings of a URL's open."""
    from ..codecs import decode_image, image_kind
    path = os.fspath(path)
    try:
        reader = ImageFolderReader(path, allow_empty=True, storage_options=storage_options)
    except LoadrError as exc:
        return [Problem(exc.path or path, exc.index, exc.message)]
    problems = []
    for i in range(len(reader)):
        file = reader._file(i)
        try:
            data = reader._files.read_all(file, i)
        except LoadrError as exc:
            problems.append(Problem(file, i, exc.message))
            continue
        kind = image_kind(data)
        if kind not in ('JPEG', 'PNG'):
            problems.append(Problem(file, i, f'not a JPEG or PNG ({kind or "unknown"}): the '
                                             f'image fns will not decode it; `loadr ingest '
                                             f'images` converts it'))
            continue
        try:
            decode_image(data)
        except LoadrError as exc:
            problems.append(Problem(file, i, exc.message))
    reader.close()
    return problems


FORMAT = Format('imagefolder', detect, ImageFolderReader, ImageFolderWriter, check)
