"""The argparse parser of the ``loadr`` command: each command's options and its function."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..readers import formats
from .bench import cmd_bench
from .common import EXIT_USAGE
from .convert import cmd_convert
from .demo import cmd_demo
from .ingest import cmd_ingest_images, cmd_ingest_json, cmd_ingest_videos
from .inspect import cmd_check, cmd_index, cmd_inspect
from .run import cmd_run


def _command(sub, name: str, func, help_text: str, example: str, parents):
    p = sub.add_parser(name, help=help_text, description=help_text, parents=parents,
                       epilog='Example:\n  ' + example.replace('\n', '\n  '),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a positive int, got {text!r}') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'expected a positive int, got {text!r}')
    return value


def _ingest_options(p, default_format: str, video: bool) -> None:
    p.add_argument('--format', choices=('bag', 'gulp'), default=default_format,
                   help=f'output format (default: {default_format})')
    p.add_argument('--workers', type=int, default=None,
                   help='processes that read and encode (default: min(8, CPUs))')
    p.add_argument('--short-side', type=_positive, default=None, metavar='PX',
                   help='shrink larger images/frames to this short side (re-encoded as JPEG)')
    if video:
        p.add_argument('--fps', type=float, default=None,
                       help='frames per second to keep from video files (default: all)')
        p.add_argument('--backend', choices=('auto', 'pyav', 'ffmpeg'), default='auto',
                       help='what decodes video files (default: PyAV, else ffmpeg)')
    p.add_argument('--skip-bad', action='store_true',
                   help='leave out unreadable files (listed at the end) instead of stopping')
    p.add_argument('--shardlen', type=_positive, default=None,
                   help='bag: datapoints per shard (default: one unsharded dataset)')
    p.add_argument('--videos-per-chunk', type=_positive, default=100,
                   help='gulp: videos per chunk file (default: 100)')


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``loadr`` command."""
    # The common options go before or after the command (loadr -v check x, loadr check -v
    # x). A subcommand's defaults would overwrite what was given before it, so there they
    # default to nothing, and its --storage-option values are kept apart and added in main.
    common, common_sub = (argparse.ArgumentParser(add_help=False) for _ in range(2))
    for where, top in ((common, True), (common_sub, False)):
        where.add_argument('-v', '--verbose', action='store_true',
                           default=False if top else argparse.SUPPRESS,
                           help='show full tracebacks and info logs')
        where.add_argument('--storage-option', action='append', metavar='KEY=VALUE',
                           dest='storage_option' if top else 'storage_option_after',
                           default=[] if top else argparse.SUPPRESS,
                           help='an fsspec storage option for URLs (s3://, https://, ...), '
                                'e.g. endpoint_url=http://127.0.0.1:9000 or loadr.retries=3; '
                                'repeat for more (AWS_* variables and the credentials chain '
                                'apply too)')
    parser = argparse.ArgumentParser(
        prog='loadr', parents=[common],
        description='loadr: a deterministic, resumable, multiprocess data loader.',
        epilog='Example:\n  loadr demo\n  loadr run configs/demo.yaml -o reader.path=data/bag\n\n'
               'Exit codes: 0 ok, 1 bad data or a failed run, 2 usage or pipeline mistake, '
               '130 interrupted.\n"loadr COMMAND --help" shows each command\'s options.',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version', version=f'loadr {__version__}')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    parents = [common_sub]

    p = _command(sub, 'demo', cmd_demo,
                 'Make a small synthetic JPEG dataset, run a real pipeline over it with '
                 'workers, and show a save/load resume giving the same batch.',
                 'loadr demo\n  loadr demo --images 256 --workers 1 --keep', parents)
    p.add_argument('--images', type=_positive, default=512, help='images to make (default 512)')
    p.add_argument('--workers', type=int, default=2, help='worker processes (default 2)')
    p.add_argument('--keep', action='store_true', help='keep the temporary dataset and YAML')

    p = _command(sub, 'run', cmd_run,
                 'Iterate a YAML pipeline with a progress bar and print a summary. Ctrl-C '
                 'stops cleanly (exit 130), saving the state when --save-state is given.',
                 'loadr run configs/imagenet_bag.yaml --steps 1000 -o loader.batch=128 '
                 '-o reader.path=/data/train --save-state state.json\n'
                 'loadr run configs/imagenet_bag.yaml --resume state.json '
                 '--save-state state.json', parents)
    p.add_argument('pipeline', nargs='?',
                   help='the pipeline YAML file (with --resume too: a state file never names '
                        'the code to run)')
    p.add_argument('--steps', type=_positive, default=None,
                   help='the goal: batches in all, counted from where the run began, also '
                        'with --resume (default: one epoch; with --resume, the saved goal)')
    p.add_argument('-o', '--override', action='append', default=[], metavar='KEY=VALUE',
                   help='change one setting, e.g. loader.batch=128, reader.path=data/x, '
                        'fns.0.size=[64,64] (value read as YAML; repeatable; with --resume, '
                        'on top of the saved ones)')
    p.add_argument('--save-state', metavar='FILE',
                   help='write the state (JSON: the loader state, the pipeline, its overrides '
                        'and the goal) here at the end or on Ctrl-C')
    p.add_argument('--resume', metavar='FILE',
                   help='go on from a state saved with --save-state: the saved overrides, to '
                        'the same goal (a saved override that names code, an import path or '
                        'unpickling, only when -o gives it again)')
    p.add_argument('--no-strict', action='store_true',
                   help='with --resume: go on from a state saved with another pipeline or '
                        "overrides anyway, from its position with its seed and order (what "
                        'differs is logged)')
    p.add_argument('--force', action='store_true',
                   help='let --save-state overwrite a state that lies ahead of this run')
    p.add_argument('--digest', action='store_true',
                   help="print each batch's stream position and sha256 to stdout")
    p.add_argument('--profile', action='store_true',
                   help='at the end (or on Ctrl-C) print where the time went: seconds per '
                        'stage (read, each fn, write, waiting) and one line of verdict')
    p.add_argument('--stats-file', metavar='PATH',
                   help="append the loader's stats (loader.stats().as_dict()) as JSON lines "
                        'to PATH, every --stats-every batches and at the end')
    p.add_argument('--stats-every', type=_positive, default=10, metavar='N',
                   help='batches between two --stats-file lines (default 10)')
    p.add_argument('--trace', metavar='PATH',
                   help='write a timeline of the run (Trace Event JSON: open it in '
                        'ui.perfetto.dev or chrome://tracing) to PATH at the end')

    p = _command(sub, 'inspect', cmd_inspect,
                 'Show a dataset: format, datapoints, spec, size on disk, and one datapoint '
                 '(shapes, dtypes, first values).',
                 'loadr inspect data/train\n  loadr inspect train.ffr --json --index 5', parents)
    p.add_argument('path', help='a gulp directory, .ffr file or directory, or bag dataset '
                   '(or a pipeline YAML whose reader is a mix: its sources)')
    p.add_argument('--json', action='store_true', help='print JSON instead of text')
    p.add_argument('--index', type=int, default=0, help='the datapoint to show (default 0)')
    p.add_argument('--allow-pickle', action='store_true',
                   help='read a gulp directory whose .gmeta files are pickles (trusted files '
                        'only: unpickling can run code; restricted to what gulpio2 writes)')

    p = _command(sub, 'check', cmd_check,
                 'Check every file of one or more datasets: index tables, sizes, duplicate '
                 'ids, every image and frame decoded, and the bytes against checksums where '
                 'there are any (FFRecord has a CRC32 per sample; bag and gulp have none, so '
                 '--write-digests records digests beside the dataset that later checks, and '
                 'readers opened with verify=True, compare). Exit code 0 only when all are '
                 'clean; each problem names the file and the index.',
                 'loadr check data/train && echo clean\n'
                 'loadr check data/train data/val --json', parents)
    p.add_argument('paths', nargs='+', metavar='PATH',
                   help='gulp directories, .ffr files or directories, or bag datasets')
    p.add_argument('--json', action='store_true', help='print JSON instead of text')
    p.add_argument('--write-digests', action='store_true',
                   help='after a clean check, record a digest of every file and record in '
                        'PATH.loadr-digests beside the dataset (the dataset is not touched)')

    p = _command(sub, 'convert', cmd_convert,
                 'Copy a dataset into another format (images stay encoded: nothing is lost). '
                 'Refuses, saying why, where the data does not fit; the output appears only '
                 'when complete. In an FFRecord sample (a msgpack map) a numpy array is stored '
                 'as msgpack-numpy stores it, a map {nd: true, type: dtype string, kind: "", '
                 'shape, data: the C-order bytes} (a numpy scalar: {nd: false, type, data}); '
                 'loadr reads it back as an array with decode msgpack.',
                 'loadr convert data/train train.ffr --to ffrecord --keys image,label\n'
                 'loadr convert train.ffr data/train_bag --to bag --shardlen 10000', parents)
    p.add_argument('src', help='the dataset to read (any format)')
    p.add_argument('dst', help='the new dataset (must not exist; ffrecord: a .ffr file)')
    p.add_argument('--to', required=True, choices=[f.name for f in formats()],
                   help='the output format')
    p.add_argument('--keys', help='copy only these keys (comma-separated)')
    p.add_argument('--frames', help='gulp: the key holding the frames (default: the jpg[] key)')
    p.add_argument('--decode', choices=('auto', 'msgpack', 'json', 'none'), default='auto',
                   help='how FFRecord samples are read (default: auto-detect)')
    p.add_argument('--allow-pickle', action='store_true',
                   help='read a gulp directory whose .gmeta files are pickles (trusted files '
                        'only: unpickling can run code; restricted to what gulpio2 writes)')
    p.add_argument('--shardlen', type=_positive, default=None,
                   help='bag: datapoints per shard (default: one unsharded dataset)')
    p.add_argument('--videos-per-chunk', type=_positive, default=100,
                   help='gulp: videos per chunk file (default 100)')

    p = _command(sub, 'index', cmd_index,
                 'Index WebDataset shards: one pass over each tar\'s headers (the member data '
                 'is skipped), kept in a sidecar <tar>.loadr-index beside it, so that loadr '
                 'reads the samples at random. loadr.open does it too, on first open, where '
                 'the tars are local and writable.',
                 "loadr index 'shards/train-{000000..000999}.tar'\n"
                 'loadr index s3://bucket/shards --storage-option endpoint_url=http://...',
                 parents)
    p.add_argument('path', help='a .tar, a directory of them, or a pattern '
                   '(train-{000000..000999}.tar, *.tar)')
    p.add_argument('--rebuild', action='store_true',
                   help='scan every tar again, even where its sidecar is good')

    p = _command(sub, 'ingest', None,
                 'Make a dataset from folders of images or videos, or a 20BN JSON list '
                 '(in parallel, with progress).',
                 'loadr ingest images photos/ data/photos\n'
                 'loadr ingest json train.json videos/ data/ssv2 --format gulp', parents)
    ingest = p.add_subparsers(dest='what', metavar='WHAT')
    p.set_defaults(func=lambda a: usage(p))
    q = _command(ingest, 'images', cmd_ingest_images,
                 'Images in DIR/<label>/ (the folder is the label, numbered in sorted order '
                 "as torchvision's ImageFolder) into a bag (default) or gulp dataset. Bag spec: "
                 'image jpg or png, label int, label_name utf8, path utf8. Every image stored '
                 'differently from its file, and every file not taken, is listed.',
                 'loadr ingest images photos/ data/photos --workers 4 --short-side 256',
                 parents)
    q.add_argument('dir', help='the folder with one subfolder per label')
    q.add_argument('out', help='the new dataset (must not exist)')
    _ingest_options(q, 'bag', video=False)
    q.add_argument('--image-type', choices=('auto', 'jpg', 'png'), default='auto',
                   help="bag: what the image key holds; files of that format are stored as they "
                        "are, others encoded (default auto: jpg when any file is a JPEG, else "
                        "png, lossless)")
    q.add_argument('--allow-empty', action='store_true',
                   help='accept class folders without images (their labels keep their numbers, '
                        "as torchvision's ImageFolder(allow_empty=True)); refused by default")
    q.add_argument('--exif-transpose', action='store_true',
                   help='rotate images by their EXIF orientation (re-encoding them); by default '
                        "the pixels are stored as the file has them, as ImageFolder reads them")
    q.add_argument('--max-side', type=_positive, default=None, metavar='PX',
                   help='store images whose long side is larger shrunk to this long side, '
                        're-encoded once (JPEG quality 90, or PNG) and listed: every epoch '
                        'after decodes less (default: off, images as they are)')
    q = _command(ingest, 'videos', cmd_ingest_videos,
                 'Videos in DIR/<label>/ (video files, or folders of frame JPEGs) into a gulp '
                 '(default) or bag dataset. Video files need PyAV or an ffmpeg binary.',
                 'loadr ingest videos clips/ data/clips --fps 8 --short-side 128', parents)
    q.add_argument('dir', help='the folder with one subfolder per label')
    q.add_argument('out', help='the new dataset (must not exist)')
    _ingest_options(q, 'gulp', video=True)
    q = _command(ingest, 'json', cmd_ingest_json,
                 'The videos of a 20BN-style JSON list [{"id": ..., "label": ...}] into a gulp '
                 '(default) or bag dataset; a video is VIDEOS/<id>/ (frame JPEGs) or '
                 'VIDEOS/<id>.webm/.mp4/...',
                 'loadr ingest json something-something-v2-train.json videos/ data/ssv2 '
                 '--labels something-something-v2-labels.json --label-field template', parents)
    q.add_argument('list', help='the JSON list of {"id", "label"} objects')
    q.add_argument('videos', help='the folder holding the videos')
    q.add_argument('out', help='the new dataset (must not exist)')
    q.add_argument('--labels', help='a JSON {label: index} file (default: sorted labels)')
    q.add_argument('--label-field', default='label',
                   help='the entry field holding the label (default: label)')
    _ingest_options(q, 'gulp', video=True)

    p = _command(sub, 'bench', cmd_bench,
                 'Measure a pipeline\'s throughput for each worker count; a table, and for '
                 'the last count a plot with --plot (needs matplotlib) and a timeline with '
                 '--trace.',
                 'loadr bench configs/imagenet_bag.yaml --workers 1,2,4,8 --steps 50 '
                 '--plot bench.png', parents)
    p.add_argument('pipeline', help='the pipeline YAML file')
    p.add_argument('--workers', default='1,2,4', help='worker counts (default 1,2,4)')
    p.add_argument('--steps', type=_positive, default=20, help='timed batches per count')
    p.add_argument('--warmup', type=int, default=2, help='untimed batches first (default 2)')
    p.add_argument('-o', '--override', action='append', default=[], metavar='KEY=VALUE',
                   help='change one setting, as for run')
    p.add_argument('--plot', metavar='PNG',
                   help="draw the last count's samples/s over time and each worker's stage "
                        'shares into this file, the verdict as its title')
    p.add_argument('--trace', metavar='PATH',
                   help="write a timeline of the last count's run (Trace Event JSON, for "
                        'ui.perfetto.dev or chrome://tracing) to this file')
    return parser


def usage(parser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE
