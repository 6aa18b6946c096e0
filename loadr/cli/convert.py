"""``loadr convert``: copy a dataset into another format."""

from __future__ import annotations

from ..progress import Progress
from .common import EXIT_OK, disk_size, plural, print_err, print_out, size_text, storage_options_of


def _list_arg(text: str | None) -> list | None:
    return [k.strip() for k in text.split(',') if k.strip()] if text else None


def cmd_convert(args) -> int:
    """Copy a dataset into another format: ``loadr convert a.ffr b --to bag``."""
    from ..convert import convert, open_source, plan_conversion
    from ..storage import settings_for
    source = open_source(args.src, args.decode, storage_options_of(args, args.src),
                         allow_pickle=args.allow_pickle)
    # Each target takes the options it knows (frames, shardlen, videos_per_chunk).
    options = {'frames': args.frames, 'shardlen': args.shardlen,
               'videos_per_chunk': args.videos_per_chunk}
    # The output's settings, made once: the plan's look at it and the writer share them.
    target = settings_for(args.dst, storage_options_of(args, args.dst))
    plan = plan_conversion(source, args.dst, args.to, _list_arg(args.keys),
                           **options, **({} if target is None else {'storage_options': target}))
    print_err(f'loadr convert: {plan.describe()}')
    bar = Progress(total=len(source), unit='datapoints', label='convert')
    convert(source, args.dst, args.to, keys=_list_arg(args.keys), progress=bar,
            storage_options=target, **options)
    bar.close()
    size, files = disk_size(args.dst)
    print_out(f'wrote {plural(len(source), "datapoint")} to {args.dst} ({args.to}, '
              f'{size_text(size)} in {files} file(s)) in {bar.elapsed:.2f} s')
    return EXIT_OK
