"""Ready transforms for a loader's ``fns`` pipeline.

Every fn is a small picklable object called as ``fn(datapoint, seed=s)``; it
returns a new dict and never changes the one it was given. The output is a
pure function of (datapoint, seed): a random fn draws only from its own
generator ``numpy.random.default_rng([seed, salt])``, never from a global RNG
or the clock. The salt is a CRC32 of the fn's name and arguments, so two fns
given the same seed draw independently: a flip and a crop, and also two
``random_resized_crop`` s of two keys (two views of one image, SimCLR-style).
Fns that must draw the same numbers on purpose (an image and its mask get
the same crop) name one stream: ``stream='pair'`` on both makes every fn of
that class with that name draw alike, whatever its key. The seed itself,
what a fn of your own receives, is the sample's seed, unsalted.

Image fns take an H×W or H×W×C array, a list of such frames (a video), or a
T×H×W×C array; a video gets the SAME crop and flip on every frame. An array
of 4 dimensions is a stack of frames; one of 2 or 3 is a single image.

From YAML each fn is named by its short name (``flip``) or by an import path
(``'mypackage.transforms:jitter'``); :func:`resolve` turns either into the
factory.

Example::

    import loadr.fns as F
    fns = [F.decode_jpeg(size=256), F.random_resized_crop(size=224), F.flip(),
           F.normalize(mean='imagenet', std='imagenet', layout='CHW')]
    dp = {'image': jpeg_bytes, 'label': 3}
    for fn in fns:
        dp = fn(dp, seed=17)

The fns live in one module per concern: :mod:`~loadr.fns.base` (the :class:`Fn`
base and argument checks), :mod:`~loadr.fns.frames` (the pixel operations the
image fns share), :mod:`~loadr.fns.jpeg`, :mod:`~loadr.fns.geometry`,
:mod:`~loadr.fns.values`, :mod:`~loadr.fns.video`, :mod:`~loadr.fns.labels`,
:mod:`~loadr.fns.structure` and :mod:`~loadr.fns.names` (:func:`resolve`).
Their public path stays ``loadr.fns``.
"""

from __future__ import annotations

from .base import IMAGENET_MEAN, IMAGENET_STD, RESIZED_CROP_TRIES, Fn  # noqa: F401 - old paths
from .geometry import center_crop, flip, random_crop, random_resized_crop, resize
from .jpeg import decode_jpeg
from .labels import label_to_index, one_hot
from .names import REGISTRY, resolve
from .structure import pad_sequence, rename, select, truncate
from .values import normalize, to_float
from .video import sample_frames

__all__ = [
    'Fn', 'REGISTRY', 'resolve',
    'decode_jpeg', 'resize', 'center_crop', 'random_crop', 'random_resized_crop', 'flip',
    'normalize', 'to_float', 'sample_frames', 'label_to_index', 'one_hot',
    'select', 'rename', 'pad_sequence', 'truncate',
]

# Every fn class keeps `loadr.fns` as its module: a pickle (a worker started by
# spawn, a saved object) names it `loadr.fns.flip` as before the split, and a
# saved state's fingerprint of a repr that names the class (a partial of a fn
# class) stays the same (tests/test_state.py pins both).
for _cls in (Fn, *REGISTRY.values()):
    _cls.__module__ = __name__
del _cls
