"""``loadr demo``: a synthetic JPEG dataset, a real pipeline over it, and a resume.

The demo needs nothing but loadr: it draws ``n`` small images (ten classes,
each a colour gradient with a few shapes and some noise), writes them as a
bag dataset with :class:`~loadr.writers.BagWriter`, writes :data:`DEMO_YAML`
beside it (the text of ``loadr/configs/demo.yaml``, installed with the package
at :data:`DEMO_YAML_PATH`), runs that pipeline with
worker processes, and shows that a state saved mid-run, loaded into a fresh
loader, gives the very same next batch.

Example::

    from loadr.demo import make_images
    make_images('/tmp/demo/images', n=64)
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib

import numpy as np

__all__ = ['DEMO_YAML', 'DEMO_YAML_PATH', 'CLASSES', 'IMAGE_HW', 'make_images', 'synthetic_image',
           'batch_digest']

CLASSES = 10
IMAGE_HW = (192, 256)          # decode_jpeg(size=64) can then scale by 1/2 while decoding
JPEG_QUALITY = 90
DATA_DIR_NAME = 'images'

# Installed with the package (package data), so that `loadr demo` can name a pipeline file
# that exists wherever loadr runs; configs/demo.yaml in the checkout is the same text.
DEMO_YAML_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs', 'demo.yaml')
DEMO_YAML = pathlib.Path(DEMO_YAML_PATH).read_text(encoding='utf-8')


def synthetic_image(rng: np.random.Generator, label: int, hw=IMAGE_HW) -> np.ndarray:
    """A uint8 H×W×3 image whose colours depend on ``label``; cheap, and JPEG-realistic.

    Drawn at half size (a gradient, three boxes, some noise) and scaled up
    by Pillow, which keeps it fast enough for 512 images in well under a
    second.

    >>> synthetic_image(np.random.default_rng(0), 3).shape
    (192, 256, 3)
    """
    from PIL import Image
    h, w = hw[0] // 2, hw[1] // 2
    hue = label / CLASSES
    base = np.array([np.sin(2 * np.pi * (hue + k / 3)) * 0.5 + 0.5 for k in range(3)],
                    np.float32)
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]
    angle = rng.uniform(0, 2 * np.pi)
    ramp = np.float32(0.5 + 0.5 * np.cos(angle)) * x + np.float32(0.5 * np.sin(angle)) * y
    img = (np.float32(102) + np.float32(153) * ramp)[:, :, None] * base
    for _ in range(3):
        cy, cx = rng.integers(0, h), rng.integers(0, w)
        r = int(rng.integers(h // 12, h // 4))
        img[max(0, cy - r):cy + r, max(0, cx - r):cx + r] = rng.uniform(0, 255, 3)
    img += rng.integers(-12, 13, (h, w, 1)).astype(np.float32)
    small = np.clip(img, 0, 255).astype(np.uint8)
    return np.asarray(Image.fromarray(small).resize((hw[1], hw[0]), Image.Resampling.BILINEAR))


def make_images(directory: str, n: int = 512, seed: int = 0) -> int:
    """Write ``n`` synthetic JPEGs with labels as a bag dataset; returns its size in bytes."""
    from PIL import Image

    from .writers import BagWriter
    rng = np.random.default_rng(seed)
    with BagWriter(directory, {'image': 'jpg', 'label': 'int'}) as w:
        for i in range(n):
            label = i % CLASSES
            buf = io.BytesIO()
            Image.fromarray(synthetic_image(rng, label)).save(buf, 'JPEG', quality=JPEG_QUALITY)
            w.append({'image': buf.getvalue(), 'label': label})
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


def batch_digest(batch: dict) -> str:
    """sha256 of a batch: every key, dtype, shape and byte (list keys by repr).

    >>> batch_digest({'x': np.zeros(2)})[:8]
    '4a90e31f'
    """
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        h.update(key.encode())
        if isinstance(value, np.ndarray):
            h.update(f'{value.dtype}{value.shape}'.encode())
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()
