"""``loadr ingest images|videos|json``: folders of images or videos, or a 20BN list, into
a dataset, with the summary of what was stored differently from the files."""

from __future__ import annotations

from ..progress import Progress
from .common import EXIT_OK, disk_size, plural, print_err, print_out, size_text

SHOWN_PER_LIST = 10    # files listed per kind of change (all of them with -v)


def _listing(title: str, entries: list, verbose: bool) -> None:
    """``title`` then each entry on its own line (the first few unless verbose), to stderr."""
    if not entries:
        return
    print_err(f'loadr: {title}:')
    shown = entries if verbose else entries[:SHOWN_PER_LIST]
    for entry in shown:
        print_err(f'  {entry}')
    if len(shown) < len(entries):
        print_err(f'  … and {len(entries) - len(shown)} more (-v lists them all)')


def _ingest_done(summary: dict, bar: Progress, verbose: bool = False) -> int:
    bar.close()
    for line in summary['skipped']:
        print_err(f'loadr: skipped {line}')
    changed = summary.get('changed', [])
    _listing('stored differently from the file (what changed)',
             [f'{path}: {", ".join(what)}' for path, what in changed], verbose)
    _listing('kept as they are, but note',
             [f'{path}: {", ".join(what)}' for path, what in summary.get('notes', [])], verbose)
    _listing('not taken (not an image in a class folder)', summary.get('ignored', []), verbose)
    size, files = disk_size(summary['out'])
    skipped = f", skipped {len(summary['skipped'])}" if summary['skipped'] else ''
    print_out(f"wrote {plural(summary['written'], 'datapoint')} "
              f"({plural(summary['labels'], 'label')}{skipped}) to "
              f"{summary['out']} ({summary['format']}, {size_text(size)}) in {bar.elapsed:.2f} s")
    if 'image_type' in summary:        # images: say what the dataset holds against the files
        parts = [f"images stored as {summary['image_type']}",
                 f"{len(changed)} changed (re-encoded, converted, shrunk or rotated)",
                 f"{len(summary['notes'])} with a note",
                 f"{plural(len(summary['ignored']), 'file')} not taken"]
        if summary['empty_labels']:
            parts.append(f"empty labels: {', '.join(summary['empty_labels'])}")
        print_out('; '.join(parts) + ('' if not (changed or summary['notes'] or summary['ignored'])
                                      else ' (listed on stderr)'))
    return EXIT_OK


def cmd_ingest_images(args) -> int:
    """Folders of images to a dataset: ``loadr ingest images photos out``."""
    from ..ingest import ingest_images
    bar = Progress(unit='images', label='ingest')
    summary = ingest_images(args.dir, args.out, format=args.format, workers=args.workers,
                            short_side=args.short_side, skip_bad=args.skip_bad, progress=bar,
                            shardlen=args.shardlen, videos_per_chunk=args.videos_per_chunk,
                            image_type=args.image_type, allow_empty=args.allow_empty,
                            exif_transpose=args.exif_transpose, max_side=args.max_side)
    return _ingest_done(summary, bar, args.verbose)


def cmd_ingest_videos(args) -> int:
    """Folders of videos to a dataset: ``loadr ingest videos clips out``."""
    from ..ingest import ingest_videos
    bar = Progress(unit='videos', label='ingest', sample_unit='frames')
    summary = ingest_videos(args.dir, args.out, format=args.format, workers=args.workers,
                            fps=args.fps, short_side=args.short_side, backend=args.backend,
                            skip_bad=args.skip_bad, progress=bar, shardlen=args.shardlen,
                            videos_per_chunk=args.videos_per_chunk)
    return _ingest_done(summary, bar)


def cmd_ingest_json(args) -> int:
    """A 20BN list to a dataset: ``loadr ingest json list.json videos out``."""
    from ..ingest import ingest_json
    bar = Progress(unit='videos', label='ingest', sample_unit='frames')
    summary = ingest_json(args.list, args.videos, args.out, format=args.format,
                          workers=args.workers, labels=args.labels, label_field=args.label_field,
                          fps=args.fps, short_side=args.short_side, backend=args.backend,
                          skip_bad=args.skip_bad, progress=bar, shardlen=args.shardlen,
                          videos_per_chunk=args.videos_per_chunk)
    return _ingest_done(summary, bar)
