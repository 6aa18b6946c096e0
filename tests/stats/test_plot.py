"""loadr.stats.plot and ``loadr bench --plot``: a PNG of the stated size, from real runs."""

from __future__ import annotations

import struct

import pytest

import loadr
from loadr.stats import PLOT_SIZE, plot

from ..loader_helpers import noisy, trivial
from ..test_cli import bag_pipeline, loadr_cmd

pytestmark = pytest.mark.timeout(120)


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    with open(path, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n' and head[12:16] == b'IHDR'
    return struct.unpack('>II', head[16:24])


def snapshots(workers: int) -> list:
    with loadr.Loader(trivial(400), batch=8, fns=[noisy], seed=1, workers=workers) as loader:
        it = iter(loader)
        out = []
        for _ in range(20):
            next(it)
            out.append(loader.stats())
    return out


def test_a_plot_is_a_png_of_the_stated_size(tmp_path):
    pytest.importorskip('matplotlib')
    taken = snapshots(2)
    assert plot(taken, tmp_path / 'series.png', size=(900, 640)) == str(tmp_path / 'series.png')
    assert png_size(tmp_path / 'series.png') == (900, 640)
    plot(taken[-1], tmp_path / 'one.png')                  # one snapshot: its average
    assert png_size(tmp_path / 'one.png') == PLOT_SIZE
    plot(snapshots(0), tmp_path / 'inline.png', size=(400, 300))
    assert png_size(tmp_path / 'inline.png') == (400, 300)


def test_loadr_bench_plot_draws_the_last_count(tmp_path, local_data):
    pytest.importorskip('matplotlib')
    pipeline = bag_pipeline(tmp_path, local_data)
    png = tmp_path / 'bench.png'
    done = loadr_cmd('bench', pipeline, '--workers', '0,1', '--steps', 4, '--warmup', 1,
                     '--plot', png)
    assert done.returncode == 0, done.stderr
    assert 'plot of workers=1 written to' in done.stdout
    assert png_size(png) == PLOT_SIZE
