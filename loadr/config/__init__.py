"""YAML pipelines: a reader, its fns and a Loader, from one file.

A pipeline file has three sections::

    reader: {format: bag, path: data/train, decode_images: false}   # format: optional
    fns:
      - decode_jpeg: {size: 256}          # a built-in, by short name, with arguments
      - flip                              # a built-in with its defaults
      - mypkg.augment:jitter: {p: 0.4}    # any importable factory, 'module:name'
    loader: {batch: 256, shuffle: true, seed: 0, workers: 8}

``reader`` names the dataset (``format`` is detected when left out) and the
reader's own options; ``fns`` lists transforms in order; ``loader`` holds the
:class:`~loadr.Loader` arguments. Paths in the file are relative to the file;
paths given as overrides are relative to the current directory.

A fn entry is a name, or a one-key mapping ``{name: args}``: a mapping of
arguments calls the factory with them, any other value is its one positional
argument (``select: [image, label]``). A built-in name always names a
factory. A bare import path (``- mypkg.aug:jitter``, no arguments) is the
transform itself, called ``fn(datapoint, seed=s)`` (a class is instantiated
first); with arguments it is a factory, called once to make the transform.

Every mistake is a :class:`~loadr.errors.ConfigError` naming the file and the
line, and what would be right: ``unknown key 'bach' in loader (line 9): did
you mean 'batch'?``. Its ``.path`` is the YAML file and ``.line`` the line.

Example::

    loader = loadr.pipeline('configs/imagenet_bag.yaml', **{'loader.batch': 128})
    loader = loadr.pipeline({'reader': {'path': 'data/train'}, 'loader': {'batch': 8}},
                            loader={'workers': 0})
"""

from __future__ import annotations

from ._config import Config, load_config, pipeline
from ._overrides import parse_override
from ._schema import LOADER_TYPES, SECTIONS

__all__ = ['pipeline', 'load_config', 'parse_override', 'Config', 'SECTIONS', 'LOADER_TYPES']
