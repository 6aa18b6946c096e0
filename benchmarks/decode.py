"""``python -m benchmarks.decode``: CPU per sample of decoding JPEGs for a crop.

One process, one core, ``time.process_time`` per sample (CPU, not wall: a
shared machine's other jobs do not count), the best of ``--runs`` rounds.
Each case decodes the same distinct q90 JPEGs (a smooth colour field plus
grain, as ``benchmarks.workloads``) and makes the same crops:

- ``plain``: the plain Pillow loop: full decode, crop, resize (antialiased
  bilinear), flip: what a user's own fn does.
- ``loadr``: loadr's pipeline as users write it (``decode_jpeg``,
  ``random_resized_crop(224)``, ``flip``; or ``resize(256)``,
  ``center_crop(224)``), fused as a Loader runs it (:mod:`loadr.decode`).
- ``loadr, whole-image decode``: the fused pipeline without loadr's extension
  (``LOADR_JPEGREGION=0``, as where ``loadr._jpegregion`` is not built):
  simplejpeg decodes the whole image at the DCT scale and numpy resizes the
  same region (the same bytes as ``loadr``).
- ``loadr unfused``: the same fns one after the other (``LOADR_FUSE=0``).
- each decoder candidate, decode + crop + resize to the same boxes at the
  DCT scale the fused path picks: Pillow ``draft``, simplejpeg, pyvips
  (shrink-on-load + crop), PyTurboJPEG (needs a system libturbojpeg),
  imagecodecs (no DCT scaling: full decode) where installed, and loadr's own
  ``loadr._jpegregion`` (only the region's rows and columns) where built.
- ``loadr, ingest --max-side 640`` (the 1600×1200 case): the fused
  pipeline on the same photos stored shrunk by ``loadr ingest images
  --max-side 640`` (the crop is then drawn on the smaller image).
- ``video``: 8 frames of 240×320 per sample, one ``random_resized_crop(112)``
  box for all (as gulp clips after ``sample_frames``); no target of its own.
- ``torchvision (PIL)``, where installed: ``RandomResizedCrop`` (or
  ``Resize``, ``CenterCrop``) and ``RandomHorizontalFlip`` on PIL images.
- ``floor``: simplejpeg at 1/8 scale with no crop or resize: the Huffman
  decoding of the whole file, which no region or DCT scale avoids.

The ratio column is CPU ÷ the plain loop's; the targets are ≤ 0.6 (rrc
375×500), ≤ 1.1× the entropy floor (rrc 1600×1200: the Huffman decoding of
the whole file, which the fused decode does so that a damaged file fails
alike on every install) and ≤ 0.5 (center_crop after resize(256)).

A second table (``--resizes``, on by default) measures the resize
candidates on the region decoder's own output for the rrc 375×500 boxes:
CPU per resize and PSNR against Pillow's antialiased bilinear of the same
box (Pillow's resize, Pillow's ``reduce`` + resize, loadr's resize in C and
its numpy twin, OpenCV's ``INTER_AREA`` and ``INTER_LINEAR`` where
``cv2`` is installed).

Example::

    python -m benchmarks.decode                 # ~1 min on one core
    python -m benchmarks.decode --images 16 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time

import numpy as np

__all__ = ['main', 'run', 'markdown', 'targets', 'pictures', 'CASES']

QUALITY = 90
OUT = 224
# (name, (height, width), pipeline): the workloads the targets are for.
CASES = (
    ('rrc 375x500', (375, 500), 'rrc'),
    ('rrc 1600x1200', (1200, 1600), 'rrc'),
    ('resize256+center_crop 375x500', (375, 500), 'center'),
    ('video 8x240x320 rrc 112', (240, 320), 'video'),
)
VIDEO_FRAMES, VIDEO_OUT = 8, 112
MAX_SIDE = 640
TARGETS = {'rrc 375x500': 0.6, 'resize256+center_crop 375x500': 0.5}
# rrc 1600x1200: loadr's CPU at most this times the entropy floor's (printed as a row).
FLOOR_TARGETS = {'rrc 1600x1200': 1.1}
FLOOR_ROW = 'floor: entropy decode (1/8)'



def pictures(n: int, h: int, w: int, seed: int = 1):
    """``n`` distinct natural-looking ``h``×``w`` RGB pictures: a smooth colour field and grain.

    >>> [p.shape for p in pictures(2, 30, 40)]
    [(30, 40, 3), (30, 40, 3)]
    """
    from PIL import Image
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, (h // 24 + 2, w // 24 + 2, 3), dtype=np.uint8)
        img = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))
        grain = rng.integers(-10, 11, (h, w, 1), dtype=np.int16)
        out.append(np.clip(img.astype(np.int16) + grain, 0, 255).astype(np.uint8))
    return out


def _jpeg(picture: np.ndarray) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, 'JPEG', quality=QUALITY)
    return buf.getvalue()


# ---------------------------------------------------------------------------
# The boxes every candidate makes: loadr's own plan for each (image, seed)


def _pipeline(kind: str):
    import loadr.fns as F
    if kind == 'rrc':
        return [F.decode_jpeg(), F.random_resized_crop(size=OUT), F.flip()]
    if kind == 'video':
        return [F.decode_jpeg(key='frames'), F.random_resized_crop(key='frames', size=VIDEO_OUT),
                F.flip(key='frames')]
    return [F.decode_jpeg(), F.resize(size=256), F.center_crop(size=OUT), F.flip()]


def _plans(kind: str, hw: tuple, seeds: range):
    """``[(box (y, x, h, w) in the source, out (h, w), flip?)]`` per seed: what the fns do."""
    from loadr.decode import Region
    fns = _pipeline(kind)
    out = []
    for seed in seeds:
        region = Region(*hw)
        for fn in fns[1:-1]:
            fn.plan(region, seed)
        flipped = fns[-1]._rng(seed).random() < fns[-1].p
        out.append((region.box, (region.h, region.w), flipped))
    return out


# ---------------------------------------------------------------------------
# The candidates: f(jpeg bytes, plan) -> uint8 array


def plain_loop(data: bytes, plan, kind: str) -> np.ndarray:
    """What a user's own Pillow fn does: full decode, crop, resize, flip (each frame of a
    video, with one box)."""
    from PIL import Image
    if kind == 'video':
        return [plain_loop(frame, plan, 'rrc') for frame in data]
    bilinear = Image.Resampling.BILINEAR
    img = Image.open(io.BytesIO(data)).convert('RGB')
    (y, x, h, w), (oh, ow), flipped = plan
    if kind == 'rrc':
        y, x, h, w = (int(round(v)) for v in (y, x, h, w))
        arr = np.asarray(img)[y:y + h, x:x + w]
        img = Image.fromarray(np.ascontiguousarray(arr)).resize((ow, oh), bilinear)
    else:
        W, H = img.size
        short = 256
        size = (short, max(1, int(short * H / W))) if W <= H else (max(1, int(short * W / H)),
                                                                  short)
        img = img.resize(size, bilinear)
        left, top = int(round((size[0] - ow) / 2)), int(round((size[1] - oh) / 2))
        img = img.crop((left, top, left + ow, top + oh))
    arr = np.asarray(img)
    return np.ascontiguousarray(arr[:, ::-1]) if flipped else arr


def _scale(plan) -> int:
    from loadr.decode import dct_scale
    (_, _, h, w), (oh, ow), _ = plan
    return dct_scale(h, w, oh, ow)


def _finish(arr: np.ndarray, plan, full: tuple) -> np.ndarray:
    from loadr.decode import resize_region
    box, out, flipped = plan
    arr = resize_region(arr, box, full, out)
    return np.ascontiguousarray(arr[:, ::-1]) if flipped else arr


def cand_pillow_draft(data, plan, full):
    from PIL import Image
    k = _scale(plan)
    with Image.open(io.BytesIO(data)) as img:
        if k > 1:
            img.draft('RGB', (-(-full[1] // k), -(-full[0] // k)))
        arr = np.asarray(img.convert('RGB') if img.mode != 'RGB' else img)
    return _finish(arr, plan, full)


def cand_simplejpeg(data, plan, full):
    import simplejpeg
    k = _scale(plan)
    arr = simplejpeg.decode_jpeg(data, min_height=-(-full[0] // k), min_width=-(-full[1] // k))
    return _finish(arr, plan, full)


def cand_pyvips(data, plan, full):
    import pyvips
    k = _scale(plan)
    img = pyvips.Image.new_from_buffer(data, '', shrink=k, access='sequential')
    (y, x, h, w), out, flipped = plan
    fy, fx = img.height / full[0], img.width / full[1]
    x0, y0 = int(x * fx), int(y * fy)
    x1, y1 = min(img.width, math.ceil((x + w) * fx)), min(img.height, math.ceil((y + h) * fy))
    arr = img.crop(x0, y0, x1 - x0, y1 - y0).numpy()
    # The crop's region, in the coordinates of a full image that arr would be at scale 1/k.
    box = ((y * fy - y0) / fy, (x * fx - x0) / fx, h, w)
    return _finish(arr, (box, out, flipped), (arr.shape[0] / fy, arr.shape[1] / fx))


def cand_turbojpeg(data, plan, full):
    k = _scale(plan)
    arr = _TURBO[0].decode(data, pixel_format=0, scaling_factor=(1, k))  # TJPF_RGB
    return _finish(arr, plan, full)


def cand_jpegregion(data, plan, full):
    from loadr.decode import decode_region
    box, out, flipped = plan
    arr = decode_region(data, _scale(plan), 'RGB', box, full, out)
    return np.ascontiguousarray(arr[:, ::-1]) if flipped else arr


def cand_imagecodecs(data, plan, full):
    import imagecodecs
    return _finish(imagecodecs.jpeg8_decode(data), plan, full)


_TURBO: list = []


def _torchvision(kind: str):
    """The same pipeline with torchvision's transforms on PIL images, or None without it."""
    try:
        import torchvision.transforms as T
    except Exception:               # not installed, or a torch it cannot load
        return None
    from PIL import Image
    if kind == 'center':
        ops = T.Compose([T.Resize(256), T.CenterCrop(OUT), T.RandomHorizontalFlip()])
    else:
        size = VIDEO_OUT if kind == 'video' else OUT
        ops = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip()])

    def one(data: bytes) -> np.ndarray:
        return np.asarray(ops(Image.open(io.BytesIO(data)).convert('RGB')))

    if kind == 'video':
        return lambda frames: [one(d) for d in frames]
    return one


def candidates() -> dict:
    """The decoders installed here, by name."""
    out = {'pillow draft': cand_pillow_draft}
    try:
        import simplejpeg  # noqa: F401
        out['simplejpeg'] = cand_simplejpeg
    except ImportError:
        pass
    try:
        import pyvips
        pyvips.cache_set_max(0)     # no cache: every sample decodes
        out['pyvips'] = cand_pyvips
    except (ImportError, OSError):
        pass
    try:
        from turbojpeg import TurboJPEG
        _TURBO[:] = [TurboJPEG()]
        out['pyturbojpeg'] = cand_turbojpeg
    except Exception:               # the module, or the system library it loads, is missing
        pass
    try:
        import imagecodecs
        if imagecodecs.JPEG8.available:
            out['imagecodecs (full decode)'] = cand_imagecodecs
    except ImportError:
        pass
    from loadr.decode import extension
    if extension() is not None:
        out['loadr._jpegregion (region)'] = cand_jpegregion
    return out


# ---------------------------------------------------------------------------
# The resize candidates, on the region's own pixels


def _resize_pillow(arr, ybox, xbox, out):
    from PIL import Image
    img = Image.frombuffer('RGB', (arr.shape[1], arr.shape[0]), arr, 'raw', 'RGB', 0, 1)
    return np.asarray(img.resize((out[1], out[0]), Image.Resampling.BILINEAR,
                                 box=(xbox[0], ybox[0], xbox[1], ybox[1])))


def _resize_pillow_reduce(arr, ybox, xbox, out):
    from PIL import Image
    img = Image.frombuffer('RGB', (arr.shape[1], arr.shape[0]), arr, 'raw', 'RGB', 0, 1)
    return np.asarray(img.resize((out[1], out[0]), Image.Resampling.BILINEAR,
                                 box=(xbox[0], ybox[0], xbox[1], ybox[1]), reducing_gap=1.0))


def _resize_loadr(arr, ybox, xbox, out):
    from loadr.decode import resample
    return resample(arr, ybox, xbox, out)


def _resize_loadr_numpy(arr, ybox, xbox, out):
    import os

    from loadr.decode import REGION_ENV, resample
    os.environ[REGION_ENV] = '0'
    try:
        return resample(arr, ybox, xbox, out)
    finally:
        del os.environ[REGION_ENV]


def _cv2(interpolation):
    import cv2
    cv2.setNumThreads(1)    # one core, as every other row

    def resize(arr, ybox, xbox, out):
        # OpenCV resizes whole pixels: the box rounded to them
        y0, y1 = int(round(ybox[0])), max(int(round(ybox[0])) + 1, int(round(ybox[1])))
        x0, x1 = int(round(xbox[0])), max(int(round(xbox[0])) + 1, int(round(xbox[1])))
        return cv2.resize(arr[y0:y1, x0:x1], (out[1], out[0]), interpolation=interpolation)
    return resize


def resize_candidates() -> dict:
    """The resizes measured on the region decoder's output, by name."""
    out = {'Pillow resize (antialiased bilinear, box)': _resize_pillow,
           'Pillow reduce + resize (reducing_gap=1)': _resize_pillow_reduce,
           "loadr resample (C: loadr._jpegregion)": _resize_loadr,
           'loadr resample (numpy twin, no extension)': _resize_loadr_numpy}
    try:
        import cv2
        out['OpenCV resize INTER_AREA (whole pixels)'] = _cv2(cv2.INTER_AREA)
        out['OpenCV resize INTER_LINEAR (whole pixels)'] = _cv2(cv2.INTER_LINEAR)
    except ImportError:
        pass
    return out


def run_resizes(images: int, samples: int, runs: int, hw=(375, 500)) -> dict:
    """CPU per sample and PSNR against Pillow's antialiased resize of each resize
    candidate, on the regions the fused rrc(224) decodes at ``hw``: ``{name: {'cpu',
    'psnr_min', 'psnr_median'}}``; empty where the extension is not built."""
    from loadr.decode import _rect, dct_scale, extension
    ext = extension()
    if ext is None:
        return {}
    datas = [_jpeg(p) for p in pictures(images, *hw)]
    items = []
    for s, (box, out, _) in enumerate(_plans('rrc', hw, range(samples))):
        k = dct_scale(box[2], box[3], *out)
        scaled = (-(-hw[0] // k), -(-hw[1] // k))
        top, bottom, left, right, ybox, xbox = _rect(scaled, box, hw, out)
        buf, rh, rw, x0 = ext.decode_region(datas[s % images], k, top, bottom - top, left,
                                            right - left, 3)
        arr = np.frombuffer(buf, np.uint8).reshape(rh, rw, 3)[:, left - x0:right - x0]
        items.append((np.ascontiguousarray(arr), ybox, xbox, out))
    reference = [_resize_pillow(*item) for item in items]
    rows = {}
    for name, fn in resize_candidates().items():
        cpu = _cpu_per_sample(fn, items, runs)
        psnrs = [_psnr(fn(*item), want) for item, want in zip(items, reference)]
        rows[name] = {'cpu': cpu, 'psnr_min': min(psnrs), 'psnr_median': float(np.median(psnrs))}
    return rows


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


# ---------------------------------------------------------------------------
# Timing


def _cpu_per_sample(fn, items, runs: int) -> float:
    best = math.inf
    for _ in range(runs):
        t0 = time.process_time()
        for item in items:
            fn(*item)
        best = min(best, (time.process_time() - t0) / len(items))
    return best


def run_case(name: str, hw: tuple, kind: str, images: int, samples: int, runs: int) -> dict:
    """CPU seconds per sample of every candidate on one case; ``{'name': .., 'rows': {..}}``."""
    from loadr.decode import fuse
    datas = [_jpeg(p) for p in pictures(images + (VIDEO_FRAMES - 1 if kind == 'video' else 0),
                                        *hw)]
    key = 'image'
    if kind == 'video':         # a sample: 8 frames of one size, each its own picture
        datas, key = [datas[i:i + VIDEO_FRAMES] for i in range(images)], 'frames'
    seeds = range(samples)
    plans = _plans(kind, hw, seeds)
    rows = {}
    items = [(datas[s % images], plans[s], kind) for s in seeds]
    rows['plain'] = _cpu_per_sample(plain_loop, items, runs)
    pipeline = _pipeline(kind)
    fused = fuse(pipeline)

    def through(fns, data, seed):
        dp = {key: data}
        for fn in fns:
            dp = fn(dp, seed=seed)
        return dp

    items = [(fused, datas[s % images], s) for s in seeds]
    rows['loadr'] = _cpu_per_sample(through, items, runs)
    import os

    import loadr.decode
    if loadr.decode.extension() is not None:
        # The same fused fns where the extension is not built: simplejpeg's whole image at
        # the DCT scale, the same region cut from it and resized in numpy (the same bytes).
        os.environ[loadr.decode.REGION_ENV] = '0'
        try:
            rows['loadr, whole-image decode'] = _cpu_per_sample(through, items, runs)
        finally:
            del os.environ[loadr.decode.REGION_ENV]
    items = [(pipeline, datas[s % images], s) for s in seeds]
    rows['loadr unfused'] = _cpu_per_sample(through, items, runs)
    if max(hw) > MAX_SIDE:
        # The same photos stored by `loadr ingest images --max-side 640`: smaller files.
        from loadr.ingest import image_bytes
        small = [image_bytes(d, 'jpg', max_side=MAX_SIDE)[0] for d in datas]
        items = [(fused, small[s % images], s) for s in seeds]
        rows[f'loadr, ingest --max-side {MAX_SIDE}'] = _cpu_per_sample(through, items, runs)
    tv = _torchvision(kind)
    if tv is not None:
        # torchvision's own transforms on PIL images draw their own boxes: the same work.
        items = [(datas[s % images],) for s in seeds]
        rows['torchvision (PIL)'] = _cpu_per_sample(tv, items, runs)
    for cname, fn in candidates().items():
        if kind == 'video':
            fn = (lambda f: lambda frames, plan, full: [f(d, plan, full) for d in frames])(fn)
        items = [(datas[s % images], plans[s], hw) for s in seeds]
        rows[cname] = _cpu_per_sample(fn, items, runs)
    # The floor of any decoder that reads the whole file: simplejpeg at 1/8 scale, no
    # crop, no resize. Huffman decoding of every block is most of it and no region or
    # scale skips it (only restart markers, or smaller files: ingest --max-side, would).
    if 'simplejpeg' in rows and kind != 'video':
        import simplejpeg
        floor = (-(-hw[0] // 8), -(-hw[1] // 8))
        items = [(datas[s % images],) for s in seeds]
        rows['floor: entropy decode (1/8)'] = _cpu_per_sample(
            lambda d: simplejpeg.decode_jpeg(d, min_height=floor[0], min_width=floor[1]),
            items, runs)
    return {'name': name, 'stage_names': [getattr(f, 'stats_name', type(f).__name__)
                                          for f in fused], 'rows': rows}


def run(scale: float = 1.0, runs: int = 3, only: str | None = None) -> dict:
    """Every case at ``scale`` (1: 16 images, 200 samples); what ``python -m benchmarks``
    keeps under ``results['decode']``."""
    images, samples = max(2, round(16 * scale)), max(20, round(200 * scale))
    cases = [run_case(name, hw, kind, images, samples, runs)
             for name, hw, kind in CASES if not only or only in name]
    return {'images': images, 'samples': samples, 'runs': runs, 'quality': QUALITY,
            'cases': cases}


def markdown(res: dict) -> str:
    """The decode tables, one per case, as markdown."""
    lines = [f"CPU per sample in one process (`time.process_time`, best of {res['runs']} runs of "
             f"{res['samples']} samples over {res['images']} distinct q{res['quality']} JPEGs); "
             f"÷ plain: against the plain Pillow loop (full decode, crop, resize, flip).", '']
    for case in res['cases']:
        plain = case['rows']['plain']
        lines += [f"{case['name']} (loadr's stages: {', '.join(case['stage_names'])}):", '',
                  '| decoder / pipeline | CPU ms/sample | ÷ plain |', '|---|---:|---:|']
        for row, cpu in case['rows'].items():
            lines.append(f'| {row} | {cpu * 1e3:.3f} | {cpu / plain:.2f} |')
        lines.append('')
    return '\n'.join(lines)


def targets(res: dict) -> list[tuple[str, str, bool]]:
    """``(target, figure, met)`` for each case with a target that ran."""
    out = []
    for case in res['cases']:
        ratio = case['rows']['loadr'] / case['rows']['plain']
        limit = TARGETS.get(case['name'])
        if limit is not None:
            out.append((f"decode {case['name']}: loadr CPU ≤ {limit}× the plain Pillow loop",
                        f'{ratio:.2f}×', ratio <= limit))
        limit = FLOOR_TARGETS.get(case['name'])
        if limit is not None and FLOOR_ROW in case['rows']:
            ratio = case['rows']['loadr'] / case['rows'][FLOOR_ROW]
            out.append((f"decode {case['name']}: loadr CPU ≤ {limit}× the entropy floor",
                        f'{ratio:.2f}×', ratio <= limit))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m benchmarks.decode',
                                description=__doc__.split('\n')[0])
    p.add_argument('--images', type=int, default=16, help='distinct JPEGs per case (default 16)')
    p.add_argument('--samples', type=int, default=200, help='samples per run (default 200)')
    p.add_argument('--runs', type=int, default=3, help='runs; the best counts (default 3)')
    p.add_argument('--only', default=None, help='cases whose name contains this')
    p.add_argument('--json', default=None, help='also write the figures here')
    p.add_argument('--no-resizes', dest='resizes', action='store_false',
                   help='skip the table of resize candidates')
    args = p.parse_args(argv)
    results = []
    for name, hw, kind in CASES:
        if args.only and args.only not in name:
            continue
        res = run_case(name, hw, kind, args.images, args.samples, args.runs)
        results.append(res)
        plain = res['rows']['plain']
        print(f'\n{name} (q{QUALITY}, {args.samples} samples, best of {args.runs}); '
              f'fused stages: {", ".join(res["stage_names"])}')
        print(f'  {"":28s} {"CPU ms/sample":>14s} {"÷ plain":>8s}')
        for row, cpu in res['rows'].items():
            print(f'  {row:28s} {cpu * 1e3:14.3f} {cpu / plain:8.2f}')
        ratio = res['rows']['loadr'] / plain
        target = TARGETS.get(name)
        verdict = ('' if target is None else
                   f' (target ≤ {target}): {"met" if ratio <= target else "NOT met"}')
        print(f'  loadr ÷ plain loop = {ratio:.2f}{verdict}')
        target = FLOOR_TARGETS.get(name)
        if target is not None and FLOOR_ROW in res['rows']:
            ratio = res['rows']['loadr'] / res['rows'][FLOOR_ROW]
            print(f'  loadr ÷ entropy floor = {ratio:.2f} (target ≤ {target}): '
                  f'{"met" if ratio <= target else "NOT met"}')
    resizes = run_resizes(args.images, args.samples, args.runs) if args.resizes else {}
    if resizes:
        print(f'\nresizes of the rrc 375x500 regions ({args.samples} samples, best of '
              f'{args.runs}); PSNR against Pillow\'s antialiased bilinear of the same box')
        print(f'  {"":45s} {"CPU ms":>8s} {"PSNR min":>9s} {"median":>7s}')
        for row, r in resizes.items():
            print(f'  {row:45s} {r["cpu"] * 1e3:8.3f} {r["psnr_min"]:9.1f} '
                  f'{r["psnr_median"]:7.1f}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'cases': results, 'resizes': resizes}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
