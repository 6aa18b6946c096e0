"""A Loader's saved state: what it holds, and whether a state fits a loader.

A state is small JSON (well under 1 KB), the same on every shard::

    {'version': 2, 'step': 4096, 'seed': 0, 'n': 1000, 'shuffle': True,
     'global_batch': 64, 'order': 2,
     'dataset': {'kind': 'ffrecord', 'digest': '3f9a0c1b2d4e'},
     'fns': ['a1b2c3', '9f8e7d']}

- ``step`` is the stream position of the next batch, ``seed`` the stream's seed.
- ``order`` is the version of the shuffle's permutation (:mod:`loadr.order`):
  a state is replayed with the order it was made with.
- ``n``, ``shuffle``, ``global_batch``, ``dataset`` and ``fns`` are the
  fingerprint of what makes the stream. ``dataset`` is the reader's kind (its
  format, or its type) and a digest of ``reader.identity()`` (format, files
  relative to the dataset, sizes), or of its type name and length for a
  reader without ``identity()``. ``fns`` holds a short digest of each fn's
  repr, with memory addresses left out, so it is the same in every process;
  where the repr cannot tell two fns apart (lambdas, closures), of its code
  too (:func:`fn_key`). A Mix's state also has ``source_fns``, the same
  digests for each source that has fns of its own.
- Under ``on_error='skip'`` a state also carries the error budget,
  ``'skipped': [window, errors, samples]`` (see :class:`~loadr.Loader`): the
  saving shard's own count, the one field that may differ between shards.

Older states still load. Version 1 (loadr 0.1) is ``{'version': 1, 'step',
'seed', 'n', 'shuffle', 'global_batch'}``; its stream was made with order
version 1, so it is replayed with that order. A dict with no ``version`` is a
state written by hand (``{'step': 640, 'seed': 0}``): only the fields it has
are checked, and the loader's own order goes on.

Example::

    state = parse(loader.save())            # checked and upgraded; StateError if malformed
    for line in differences(state, mine):   # what differs from this loader's fingerprint
        print(line)
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import types
from collections.abc import Sequence
from typing import Any

from .errors import StateError
from .order import MAX_SEED, ORDER_VERSIONS
from .sources import Composite, Identified

__all__ = ['STATE_VERSION', 'MAX_STEP', 'fingerprint', 'parse', 'differences', 'fn_key', 'check',
           'source_fn_names']

STATE_VERSION = 2
MAX_STEP = 2**63 - 1                # positions are uint64 below 2**63 (loadr.order)
_ADDRESS = re.compile(r' at 0x[0-9a-fA-F]+')


def _digest(value, size: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(',', ':'), default=str)
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def fn_name(fn) -> str:
    """A repr of ``fn`` that is the same in every process (no memory addresses).

    >>> def jitter(dp, seed):
    ...     return dp
    >>> fn_name(jitter)
    'loadr.state.jitter'
    """
    if isinstance(fn, types.FunctionType):
        return f'{fn.__module__}.{fn.__qualname__}'.replace('.<locals>', '')
    return _ADDRESS.sub('', repr(fn))


def fn_key(fn) -> str:
    """What a state's fingerprint digests for ``fn``: :func:`fn_name`, and where that name
    cannot tell two fns apart, a digest of their code and values.

    A module-level function (or a fn with its own repr) is known by its name, as it
    always was. A lambda, a function defined inside another, a closure, a partial
    of one, or an object whose repr is a memory address, also by its code
    (bytecode, constants, names), its defaults, its closure's values and its
    attributes, where those are plain values; so two lambdas that differ have
    different keys. No memory address or hash order goes in: the key is the same
    in every process and run of the same code.

    >>> fn_key(lambda dp, seed: dp) == fn_key(lambda dp, seed: dp)
    True
    >>> fn_key(lambda dp, seed: dp) == fn_key(lambda dp, seed: {**dp, 'x': 1})
    False
    """
    name = fn_name(fn)
    if _named(fn):
        return name
    text = _stable(fn, 0)
    return f'{name}#{hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}'


def _named(fn) -> bool:
    """Whether ``fn_name(fn)`` alone tells ``fn`` from any other fn."""
    if isinstance(fn, types.FunctionType):
        return ('<lambda>' not in fn.__qualname__ and '<locals>' not in fn.__qualname__
                and not fn.__closure__)
    if isinstance(fn, functools.partial):
        return _named(fn.func) and not _ADDRESS.search(repr((fn.args, fn.keywords)))
    return not _ADDRESS.search(repr(fn))


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _stable(value, depth: int) -> str:
    """A text for ``value`` that is the same in every process: plain values by repr,
    containers item by item (sets sorted), code by its bytecode, constants and names;
    anything else by its type and, a few levels deep, its attributes."""
    if depth > 6:
        return '...'
    depth += 1
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (tuple, list)):
        inner = ','.join(_stable(v, depth) for v in value)
        return f'({inner})' if isinstance(value, tuple) else f'[{inner}]'
    if isinstance(value, (set, frozenset)):
        return '{' + ','.join(sorted(_stable(v, depth) for v in value)) + '}'
    if isinstance(value, dict):
        return '{' + ','.join(sorted(f'{_stable(k, depth)}:{_stable(v, depth)}'
                                     for k, v in value.items())) + '}'
    if isinstance(value, types.CodeType):
        return (f'code({value.co_code.hex()},{_stable(value.co_consts, depth)},'
                f'{value.co_names},{value.co_varnames},{value.co_freevars})')
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(_stable(cell.cell_contents, depth))
            except ValueError:                      # an empty cell
                cells.append('<empty>')
        return (f'function({value.__module__}.{value.__qualname__},'
                f'{_stable(value.__code__, depth)},{_stable(value.__defaults__, depth)},'
                f'{_stable(value.__kwdefaults__, depth)},[{",".join(cells)}])')
    if isinstance(value, functools.partial):
        return (f'partial({_stable(value.func, depth)},{_stable(value.args, depth)},'
                f'{_stable(value.keywords, depth)})')
    if isinstance(value, types.MethodType):
        return f'method({_stable(value.__func__, depth)},{_stable(value.__self__, depth)})'
    if isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)):
        qualname = getattr(value, '__qualname__', value.__name__)
        return f'{getattr(value, "__module__", "")}.{qualname}'
    kind = f'{type(value).__module__}.{type(value).__qualname__}'
    shape, dtype, tobytes = (getattr(value, k, None) for k in ('shape', 'dtype', 'tobytes'))
    if shape is not None and dtype is not None and callable(tobytes):     # an array
        data = tobytes() if getattr(value, 'nbytes', 1 << 30) <= 1 << 20 else b''
        return f'{kind}({dtype},{shape},{hashlib.blake2b(data).hexdigest()})'
    text = repr(value)
    if not _ADDRESS.search(text):
        return text
    attributes = getattr(value, '__dict__', None)
    return f'{kind}({_stable(attributes, depth) if isinstance(attributes, dict) else ""})'


def dataset_identity(reader, n: int) -> dict:
    """``reader.identity()`` if the reader has it, else its type name and length."""
    if isinstance(reader, Identified):
        return reader.identity()
    return {'type': type(reader).__name__, 'n': n}


def fingerprint(reader, fns, n: int, shuffle: bool, global_batch: int,
                order_version: int) -> dict:
    """The fields of a state that say what makes the stream (everything but step and seed).

    >>> f = fingerprint([{'x': 1}] * 3, [], 3, True, 2, 2)
    >>> f['dataset']['kind'], f['n'], f['fns']
    ('list', 3, [])
    """
    identity = dataset_identity(reader, n)
    kind = str(identity.get('format') or identity.get('type') or type(reader).__name__)[:40]
    out = {'n': n, 'shuffle': shuffle, 'global_batch': global_batch, 'order': order_version,
           'dataset': {'kind': kind, 'digest': _digest(identity, 6)},
           'fns': [_digest(fn_key(fn), 3) for fn in fns]}
    if isinstance(reader, Composite):
        # A Mix's per-source fns make its stream too: {source: [digest, ...]} for
        # the sources that have fns (a state without the field predates it).
        out['source_fns'] = {name: [_digest(fn_key(fn), 3) for fn in chain]
                             for name, chain in reader.source_fns().items() if chain}
    return out


def _int(state: dict, key: str, lo: int, hi: int) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, '__index__'):
        raise StateError(f'{key} must be an int, got {value!r}')
    value = value.__index__()
    if not lo <= value <= hi:
        raise StateError(f'{key} must be in [{lo}, {hi}], got {value}')
    return value


def parse(state) -> dict:
    """``state`` checked and brought to the current version; StateError if it is malformed.

    >>> parse({'version': 1, 'step': 8, 'seed': 0, 'n': 5, 'shuffle': True,
    ...        'global_batch': 4})['order']
    1
    """
    if not isinstance(state, dict) or 'step' not in state or 'seed' not in state:
        raise StateError(f"a loader state is a dict with 'step' and 'seed', got {state!r}"[:300])
    version = state.get('version')
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise StateError(f'state version must be an int, got {version!r}')
        if version > STATE_VERSION:
            raise StateError(f'state version {version} is newer than this loadr understands '
                             f'({STATE_VERSION}); upgrade loadr')
        if version < 1:
            raise StateError(f'state version must be 1 or more, got {version}')
    out: dict[str, Any] = {'step': _int(state, 'step', 0, MAX_STEP),
                           'seed': _int(state, 'seed', 0, MAX_SEED)}
    for key in ('n', 'global_batch'):
        if key in state:
            out[key] = _int(state, key, 1, MAX_STEP)
    if 'shuffle' in state:
        if not isinstance(state['shuffle'], bool):
            raise StateError(f"shuffle must be true or false, got {state['shuffle']!r}")
        out['shuffle'] = state['shuffle']
    if version == 1:
        out['order'] = 1                # loadr 0.1 had one order, version 1's
    elif 'order' in state:
        if state['order'] not in ORDER_VERSIONS or isinstance(state['order'], bool):
            raise StateError(f"order version {state['order']!r} is unknown to this loadr "
                             f'(it knows {list(ORDER_VERSIONS)}); upgrade loadr')
        out['order'] = state['order']
    if 'dataset' in state:
        dataset = state['dataset']
        if (not isinstance(dataset, dict) or not isinstance(dataset.get('kind'), str)
                or not isinstance(dataset.get('digest'), str)):
            raise StateError(f"dataset must be {{'kind': str, 'digest': str}}, got {dataset!r}")
        out['dataset'] = {'kind': dataset['kind'], 'digest': dataset['digest']}
    if 'fns' in state:
        fns = state['fns']
        if not isinstance(fns, list) or not all(isinstance(f, str) for f in fns):
            raise StateError(f'fns must be a list of digests, got {fns!r}'[:300])
        out['fns'] = list(fns)
    if 'source_fns' in state:
        by_source = state['source_fns']
        if not isinstance(by_source, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and all(isinstance(f, str) for f in v)
                for k, v in by_source.items()):
            raise StateError(f'source_fns must map source names to lists of digests, got '
                             f'{by_source!r}'[:300])
        out['source_fns'] = {k: list(v) for k, v in by_source.items()}
    if 'skipped' in state:
        skipped = state['skipped']
        if (not isinstance(skipped, list) or len(skipped) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                           for v in skipped)):
            raise StateError(f'skipped must be [window, errors, samples], got {skipped!r}')
        out['skipped'] = list(skipped)
    return out


def differences(saved: dict, mine: dict, fn_names: Sequence[str] = (),
                source_fn_names: dict | None = None) -> list[str]:
    """One line per field of the fingerprint (and the seed) where ``saved`` and ``mine``
    differ; fields the saved state lacks are not compared. ``fn_names`` are this
    loader's fns, to name the one that differs; ``source_fn_names`` the same for each
    source of a Mix (``{source: [name, ...]}``).

    >>> differences({'seed': 1, 'shuffle': True}, {'seed': 2, 'shuffle': True})
    ['seed: the state was saved with seed 1, this loader has seed 2']
    """
    out = []

    def lacks(key):
        return key not in saved or key not in mine

    if not lacks('seed') and saved['seed'] != mine['seed']:
        out.append(f"seed: the state was saved with seed {saved['seed']}, this loader has "
                   f"seed {mine['seed']}")
    if not lacks('n') and saved['n'] != mine['n']:
        out.append(f"dataset size: the state was saved for {saved['n']} datapoints per epoch, "
                   f"this loader reads {mine['n']}")
    if not lacks('dataset') and saved['dataset'] != mine['dataset']:
        was, now = saved['dataset'], mine['dataset']
        out.append(f"dataset: the state was saved reading {was['kind']} (identity "
                   f"{was['digest']}), this loader reads {now['kind']} (identity "
                   f"{now['digest']}): other files, or files of other sizes")
    if not lacks('fns') and saved['fns'] != mine['fns']:
        was, now = saved['fns'], mine['fns']
        if len(was) != len(now):
            out.append(f'fns: the state was saved with {len(was)} fns, this loader has '
                       f'{len(now)}')
        else:
            k = next(i for i, (a, b) in enumerate(zip(was, now)) if a != b)
            name = fn_names[k] if k < len(fn_names) else '?'
            out.append(f"fns: fn {k} differs from the one the state was saved with (this "
                       f"loader's: {name})")
    if not lacks('source_fns') and saved['source_fns'] != mine['source_fns']:
        was, now, names = saved['source_fns'], mine['source_fns'], source_fn_names or {}
        for source in sorted(set(was) | set(now)):
            a, b = was.get(source, []), now.get(source, [])
            if a == b:
                continue
            if len(a) != len(b):
                out.append(f'fns of source {source!r}: the state was saved with {len(a)} fns, '
                           f'this loader has {len(b)}')
                continue
            k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            mine_k = names.get(source, [])
            name = mine_k[k] if k < len(mine_k) else '?'
            out.append(f"fns of source {source!r}: fn {k} differs from the one the state was "
                       f"saved with (this loader's: {name})")
    if not lacks('shuffle') and saved['shuffle'] != mine['shuffle']:
        out.append(f"shuffle: the state was saved with shuffle={saved['shuffle']}, this "
                   f"loader has shuffle={mine['shuffle']}")
    if not lacks('global_batch') and saved['global_batch'] != mine['global_batch']:
        out.append(f"global batch: the state was saved with {saved['global_batch']} datapoints "
                   f"per step (batch x num_shards), this loader has {mine['global_batch']}")
    return out


def source_fn_names(reader) -> dict:
    """``{source: [fn name, ...]}`` of a Mix's per-source fns (for a refused state's message)."""
    if not isinstance(reader, Composite):
        return {}
    return {name: [fn_name(fn) for fn in chain] for name, chain in reader.source_fns().items()}


def check(state, mine: dict, fns=(), reader=None, strict: bool = True) -> tuple[dict, list[str]]:
    """``(parsed state, what differs)``: ``state`` checked (:func:`parse`) and compared with
    ``mine``, a loader's seed and :func:`fingerprint` (:func:`differences`; ``fns`` and
    ``reader`` name what differs). With ``strict``, a state that differs is refused
    with a StateError listing it. Touches nothing, so a refused state leaves the loader
    (and every iteration in progress) exactly as it was.

    >>> mine = {'seed': 0, **fingerprint([{'x': 1}], [], 1, True, 1, 2)}
    >>> check({'step': 3, 'seed': 0}, mine)
    ({'step': 3, 'seed': 0}, [])
    """
    parsed = parse(state)
    diffs = differences(parsed, mine, [fn_name(fn) for fn in fns], source_fn_names(reader))
    if diffs and strict:
        raise StateError('this state does not belong to this loader:\n  - '
                         + '\n  - '.join(diffs) + '\nCreate the Loader as it was when '
                         'the state was saved, or call load(state, strict=False) to go on '
                         "from the state's step with its seed and order anyway.")
    return parsed, diffs
