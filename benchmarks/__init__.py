"""Benchmarks: loadr against torch's DataLoader, granular, grain and gulpio2, side by side.

Run everything with ``python -m benchmarks`` (needs the ``bench`` extra);
``python -m benchmarks.readers`` runs the reader table alone. Results go
to ``benchmarks/out/`` and ``BENCHMARKS.md``.

Example::

    python -m benchmarks --scale 0.1 --runs 2 --no-publish
"""
