"""``loadr inspect`` (a dataset and one datapoint, or a mix's sources), ``loadr check``
(every file of a dataset) and ``loadr index`` (WebDataset shards' sidecar indexes)."""

from __future__ import annotations

import io
import json
import os
import time

from ..errors import ConfigError
from ..progress import Progress
from ..readers.patterns import names_files
from ..storage import is_url
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    disk_size,
    plural,
    print_err,
    print_out,
    size_text,
    storage_options_of,
)

FIRST_VALUES = 8          # values shown per array by inspect


def _reader_size(reader) -> tuple[int, int]:
    """(bytes, files) that ``reader`` reads, from its identity (a URL has no disk to walk)."""
    identity = reader.identity()
    if 'files' in identity:
        return sum(identity['files'].values()), len(identity['files'])
    return int(identity.get('bytes', 0)), int(identity.get('file_count', 0))


def _summary(value) -> dict:
    """A JSON-able description of one value: type, shape/dtype/len and the first values."""
    import numpy as np
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)[:FIRST_VALUES]
        first: list
        if value.dtype == object:
            first = [repr(v) for v in flat]
        elif value.dtype.kind in 'fc':
            first = [float(f'{v:.6g}') if value.dtype.kind == 'f' else str(v) for v in flat]
        else:
            first = flat.tolist()
        return {'type': 'array', 'dtype': str(value.dtype), 'shape': list(value.shape),
                'first': first}
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        kind = ('jpeg' if data[:2] == b'\xff\xd8' else
                'png' if data[:8] == b'\x89PNG\r\n\x1a\n' else None)
        out = {'type': 'bytes', 'len': len(data), 'first': data[:16].hex()}
        if kind:
            out['looks_like'] = kind
            out.update(_image_header(data))
        return out
    if isinstance(value, str):
        return {'type': 'str', 'len': len(value), 'value': value[:80]}
    if isinstance(value, (bool, int, float)) or value is None or isinstance(value, np.generic):
        return {'type': type(value).__name__, 'value': value.item() if isinstance(
            value, np.generic) else value}
    if isinstance(value, (list, tuple)):
        out = {'type': 'list', 'len': len(value)}
        if value:
            out['first'] = _summary(value[0])
        return out
    if isinstance(value, dict):
        text = repr(value)
        return {'type': 'dict', 'keys': [str(k) for k in value][:20],
                'value': text if len(text) <= 120 else text[:117] + '...'}
    return {'type': type(value).__name__, 'value': repr(value)[:80]}


def _image_header(data: bytes) -> dict:
    """The decoded shape of encoded image bytes, from the header alone."""
    from PIL import Image

    from ..codecs import IMAGE_FORMATS
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            w, h = img.size
            channels = len(img.getbands())
    except Exception:  # noqa: BLE001 - a summary never fails on a bad image
        return {}
    return {'image_shape': [h, w] if channels == 1 else [h, w, channels]}


def _summary_text(s: dict) -> str:
    kind = s['type']
    if kind == 'array':
        return f"{s['dtype']} array {tuple(s['shape'])}, first values {s['first']}"
    if kind == 'bytes':
        shape = 'x'.join(map(str, s.get('image_shape', ())))
        like = f" ({s['looks_like']} {shape})" if 'looks_like' in s else ''
        return f"{s['len']} bytes{like}, starting {s['first']}"
    if kind == 'str':
        return f"str of {s['len']} chars: {s['value']!r}"
    if kind == 'list':
        first = f", first: {_summary_text(s['first'])}" if 'first' in s else ''
        return f"list of {s['len']}{first}"
    if kind == 'dict':
        return f"dict {s['value']}"
    return f"{kind} {s['value']!r}"


def _inspect_mix(args) -> int:
    """``loadr inspect mix.yaml``: each source's size, weight and epochs per 10^6 samples."""
    from ..config import load_config
    from ..mix import Mix
    # The slack covers the coarse clock (a tick) that stamps file times.
    since = time.time_ns() - 20_000_000
    reader = load_config(args.path, storage_options=args.storage_options).build_reader()
    if not isinstance(reader, Mix):
        raise ConfigError(f'{args.path}: inspect takes a pipeline file only for a mix '
                          f'(reader: {{mix: ...}}); give the dataset path itself')
    wrote = _indexes_written(reader, since)
    per = 10**6
    info = {'path': args.path, 'format': 'mix', 'datapoints': len(reader),
            'source_key': reader.source_key, 'schedule': []}
    for position, _ in reader.schedule:
        weights = reader.weights_at(position)
        info['schedule'].append({'from': position, 'sources': [
            {'name': name, 'datapoints': size, 'weight': weights[name],
             'epochs_per_million': weights[name] * per / size}
            for name, size in zip(reader.names, reader.sizes)]})
    if wrote:
        # A mix's sources are opened as a run opens them, which keeps WebDataset indexes.
        note = (f'opening the mix wrote {plural(len(wrote), "index file")} beside the tars of '
                f'its WebDataset sources, as a run does (loadr inspect on the shards '
                f'themselves writes nothing)')
        info['wrote'] = wrote
        print_err(f'loadr inspect: {note}')
    if args.json:
        print_out(json.dumps(info, indent=2))
        return EXIT_OK
    print_out(f'{args.path}: a mix of {len(reader.names)} sources, {len(reader)} datapoints in all')
    for part in info['schedule']:
        if len(info['schedule']) > 1:
            print_out(f"  from position {part['from']}:")
        width = max(len(s['name']) for s in part['sources'])
        print_out(f"  {'source':<{width}}  {'datapoints':>12}  {'weight':>8}  "
                  f"epochs per 10^6 samples")
        for s in part['sources']:
            print_out(f"  {s['name']:<{width}}  {s['datapoints']:>12}  {s['weight']:>8.4g}  "
                      f"{s['epochs_per_million']:.4g}")
    return EXIT_OK


def _indexes_written(mix, since: int) -> list[str]:
    """The WebDataset index files beside the tars of ``mix``'s sources written since
    ``since`` (a time.time_ns()): those its opening wrote."""
    from ..readers.webdataset.index import SIDECAR_SUFFIX
    out = []
    for source in mix.sources.values():
        if getattr(source, 'format_name', None) != 'webdataset':
            continue
        for tar in source.files:
            if is_url(tar):
                continue
            try:
                if os.stat(tar + SIDECAR_SUFFIX).st_mtime_ns >= since:
                    out.append(tar + SIDECAR_SUFFIX)
            except OSError:
                continue
    return out


def cmd_inspect(args) -> int:
    """Describe a dataset and one datapoint: ``loadr inspect data/train --json``."""
    from ..readers import detect
    from ..storage import settings_for
    path = args.path
    if path.endswith(('.yaml', '.yml')) and os.path.isfile(path):
        return _inspect_mix(args)
    # A URL's settings, made once: the detection and the reader share its storage.
    settings = settings_for(path, storage_options_of(args, path))
    fmt = detect(path, settings)
    # What to show besides the datapoint is the format's to say (its reader's details()).
    # A look writes nothing: a format that would keep an index beside its files (WebDataset)
    # builds it in memory here.
    options = {} if settings is None else {'storage_options': settings}
    reader = fmt.reader.probe(path, allow_pickle=args.allow_pickle, write_index=False,
                              **options)
    with reader:
        n = len(reader)
        extra = reader.details()
        if names_files(path, settings):     # files named by a pattern: the reader's own
            sizes = reader._identity_files()
            size, files = sum(sizes.values()), len(sizes)
        elif is_url(path):
            size, files = _reader_size(reader)      # a URL has no disk to walk
        else:
            size, files = disk_size(path)
        info = {'path': path, 'format': fmt.name, 'datapoints': n,
                'spec': {str(k): str(v) for k, v in reader.spec.items()},
                'size_bytes': size, 'files': files, **extra}
        if n:
            index = args.index if args.index >= 0 else n + args.index
            if not 0 <= index < n:
                raise ConfigError(f'--index {args.index} is out of range: the dataset has {n} '
                                  f'datapoints')
            dp = reader[index]
            info['datapoint'] = {'index': index,
                                 'keys': {str(k): _summary(v) for k, v in dp.items()}}
    if args.json:
        print_out(json.dumps(info, indent=2, default=str))
        return EXIT_OK
    print_out(f"{info['path']}: {info['format']}, {n} datapoints, {size_text(size)} in "
              f"{files} file(s)")
    for key in extra:
        print_out(f'  {key}: {extra[key]}')
    print_out('  spec: ' + ', '.join(f'{k}: {v}' for k, v in info['spec'].items()))
    if n:
        print_out(f"  datapoint {info['datapoint']['index']}:")
        width = max(len(k) for k in info['datapoint']['keys'])
        for key, s in info['datapoint']['keys'].items():
            print_out(f'    {key:<{width}}  {_summary_text(s)}')
    return EXIT_OK


def cmd_check(args) -> int:
    """Check datasets; exit 1 if any has a problem: ``loadr check data/train``."""
    from ..check import check, write_digests
    reports = []
    for path in args.paths:
        t0 = time.perf_counter()
        options = storage_options_of(args, path)
        report = check(path, options)
        reports.append(report)
        wrote = None
        if args.write_digests and report.ok:
            wrote = write_digests(path, options)
        if args.json:
            continue
        if report.ok:
            # Say what was checked: no checksum is promised where the format has none.
            what = (f'checked against {report.checksums}' if report.checksums else
                    f'structure and decoding only: {report.format} has no checksums; '
                    f'loadr check --write-digests records digests to check against')
            print_out(f'{report.path}: {report.format}, OK: no problems ({what}; '
                      f'{time.perf_counter() - t0:.2f} s)')
        else:
            print_out(str(report))
        if wrote:
            print_out(f'{report.path}: wrote digests of every file and record to {wrote}')
        elif args.write_digests:
            print_out(f'{report.path}: digests not written: the check found problems')
    if args.json:
        out = [{'path': r.path, 'format': r.format, 'ok': r.ok, 'checksums': r.checksums,
                'problems': [{'path': p.path, 'index': p.index, 'message': p.message}
                             for p in r.problems]} for r in reports]
        print_out(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    return EXIT_OK if all(r.ok for r in reports) else EXIT_FAILED


def cmd_index(args) -> int:
    """Index WebDataset shards once: ``loadr index 'shards/train-{000000..000099}.tar'``."""
    from ..readers.webdataset import build_index
    bar = None
    seen = [0]

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress(total=total, unit='bytes', label='index')
        bar.update(done - seen[0])
        seen[0] = done
    t0 = time.perf_counter()
    built = build_index(args.path, write=True, progress=progress, rebuild=args.rebuild,
                        storage_options=storage_options_of(args, args.path))
    if bar is not None:
        bar.close()
    total = sum(index.tar_size for _, index in built)
    read = sum(index.bytes_read for _, index in built)
    scanned = sum(1 for _, index in built if index.bytes_read)
    kept = sum(1 for _, index in built if index.sidecar)
    samples = sum(index.samples for _, index in built)
    members = sum(index.members for _, index in built)
    print_out(f'{args.path}: {plural(len(built), "tar")}, {plural(samples, "sample")} of '
              f'{plural(members, "member")}; scanned {scanned} (read {size_text(read)} of '
              f'{size_text(total)}, {100 * read / max(1, total):.2f}% of the bytes: the headers), '
              f'{len(built) - scanned} had a good index; {kept} sidecar(s) beside the tars '
              f'({time.perf_counter() - t0:.2f} s)')
    if kept < len(built):
        print_err(f'loadr index: {len(built) - kept} index(es) could not be written beside their '
                  f'tar (read-only place); loadr builds them in memory when it opens the shards')
    return EXIT_OK
