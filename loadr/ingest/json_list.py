"""A 20BN-style JSON list (Something-Something, Jester) of ``{"id", "label"}`` entries,
its labels file, and :func:`ingest_json` (the listed videos into a dataset)."""

from __future__ import annotations

import os

from ..errors import ConfigError
from ..jsonfiles import read_json
from .scan import VIDEO_EXTENSIONS
from .videos import need_backend, video_task
from .writer import check_out, default_workers, write_records


def _load_labels(path: str) -> dict:
    table = read_json(path, 'the label list', dict, '{label: index}')
    out = {}
    for label, idx in table.items():
        # 20BN's labels files store the indices as strings ("0", "1", ...).
        if isinstance(idx, str) and idx.strip().lstrip('-').isdigit():
            idx = int(idx)
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ConfigError(f'label {label!r} maps to {idx!r}, not an int', path)
        out[label] = idx
    return out


def read_list(path: str, label_field: str = 'label') -> list[tuple[str, str | None, dict]]:
    """``[(id, label or None, meta), ...]`` from a 20BN-style JSON list.

    ``label_field='template'`` reads Something-Something's templates, with
    their ``[`` ``]`` removed as in its labels file.
    """
    entries = read_json(path, 'the list', list, 'of {"id": ..., "label": ...}')
    out, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get('id'), (str, int)) \
                or isinstance(entry.get('id'), bool):
            raise ConfigError(f'entry {i} must be an object with an "id" (string or int), '
                              f'got {entry!r:.80}', path)
        id_ = str(entry['id'])
        if id_ in seen:
            raise ConfigError(f'entry {i}: id {id_!r} appears twice', path)
        seen.add(id_)
        label = entry.get(label_field)
        if label is not None and not isinstance(label, str):
            label = str(label)
        if label is not None and label_field == 'template':
            label = label.replace('[', '').replace(']', '')
        meta = {k: v for k, v in entry.items() if k != 'id'}
        if label is not None:
            meta['label'] = label
        out.append((id_, label, meta))
    if not out:
        raise ConfigError('the list is empty', path)
    return out


def _find_video(videos: str, id_: str) -> str | None:
    folder = os.path.join(videos, id_)
    if os.path.isdir(folder):
        return folder
    for ext in VIDEO_EXTENSIONS:
        if os.path.isfile(folder + ext):
            return folder + ext
    return None


def ingest_json(list_path: str, videos: str, out: str, format: str = 'gulp',  # noqa: A002
                workers: int | None = None, labels: str | dict | None = None,
                label_field: str = 'label', fps: float | None = None,
                short_side: int | None = None, backend: str = 'auto', skip_bad: bool = False,
                progress=None, shardlen: int | None = None, videos_per_chunk: int = 100) -> dict:
    """Write the videos of a 20BN-style list (``[{"id", "label"}, ...]``) into ``out``.

    ``labels`` is a ``{label: index}`` dict or JSON file (20BN's labels
    file, string indices accepted); default: the list's labels, sorted.

    Example::

        ingest_json('jester-train.json', '20bn-jester-v1', 'data/jester', format='gulp')
    """
    check_out(out, format)
    if not os.path.isdir(videos):
        raise ConfigError('the videos folder does not exist', videos)
    entries_in = read_list(list_path, label_field)
    if isinstance(labels, (str, os.PathLike)):
        label2idx = _load_labels(os.fspath(labels))
    elif isinstance(labels, dict):
        label2idx = dict(labels)
    else:
        label2idx = {label: i for i, label in enumerate(
            sorted({lb for _, lb, _ in entries_in if lb is not None}))}
    unknown = sorted({lb for _, lb, _ in entries_in if lb is not None and lb not in label2idx})
    if unknown:
        raise ConfigError(f'{len(unknown)} label(s) of the list are not in the label mapping, '
                          f'e.g. {unknown[0]!r}', list_path)
    paths, missing = [], []
    for id_, _, _ in entries_in:
        path = _find_video(videos, id_)
        (missing.append(id_) if path is None else paths.append(path))
    if missing:
        raise ConfigError(f'{len(missing)} video(s) of the list are missing from the videos '
                          f'folder, e.g. id {missing[0]!r} (looked for a folder <id>/ or a file '
                          f'<id>{{{",".join(VIDEO_EXTENSIONS)}}})', videos)
    need_backend(paths, backend)
    if progress is not None:
        progress.total = len(paths)
    jobs = [(p, fps, short_side, backend) for p in paths]
    entries = [(p, id_, label, meta)
               for p, (id_, label, meta) in zip(paths, entries_in, strict=True)]
    return write_records(out, format, jobs, video_task, default_workers(workers), entries,
                         label2idx, progress, skip_bad, videos_per_chunk, shardlen, video=True)
