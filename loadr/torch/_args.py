"""torch's DataLoader arguments in loadr's terms, for :class:`loadr.torch.DataLoader`:
the rank and world size, the sizes under torch's names, the arguments loadr sets itself
or has no use for (a TypeError that says the loadr way), the seed from a generator, the
device.
Imports torch (``import loadr`` never imports it)."""

from __future__ import annotations

import inspect
import os

import numpy as np
import torch

from ..errors import ConfigError
from ..loader import MAX_BATCH, MAX_WORKERS, Loader, check_whole

# Loader arguments the DataLoader sets itself, by their torch names.
OWN_ARGS = {'batch': 'batch_size', 'workers': 'num_workers', 'shard_id': 'rank',
            'num_shards': 'world_size'}
# torch DataLoader arguments with no meaning here (None, torch's default, is taken),
# and the loadr way to get what they are for.
_ORDER_WAY = ("the order is loadr's: a resumable permutation of every epoch (shuffle=, "
              "seed=), split between ranks by rank= and world_size=; to read a subset, "
              "pass a reader of it (anything with len() and [i])")
_TORCH_ONLY = {
    'collate_fn': "loadr stacks each key of the datapoints into the batch itself (arrays "
                  "in shared memory, other values as lists); transform datapoints with "
                  "fns=[fn, ...] (each called as fn(datapoint, seed=s), returning a new "
                  "datapoint), or the batches after the loop",
    'sampler': _ORDER_WAY,
    'batch_sampler': _ORDER_WAY + '; batch_size= and drop_last= make the batches',
    'pin_memory_device': "pin_memory=True pins for CUDA; device='cuda:N' delivers the "
                         "batches on that device",
    'snapshot_every_n_steps': 'state_dict() is exact at every step, at no cost',
}


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple:
    """``(rank, world_size)``: the arguments, else the initialised default process group,
    else torchrun's ``RANK``/``WORLD_SIZE`` environment, else ``(0, 1)``.

    >>> rank_and_world_size(1, 4)
    (1, 4)
    """
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = (_env_int('RANK', 0), _env_int('WORLD_SIZE', 1))
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    for name, value in (('rank', rank), ('world_size', world_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f'{name} must be an int, got {value!r}')
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f'rank must be in [0, world_size) and world_size >= 1, got '
                          f'rank={rank}, world_size={world_size}')
    return int(rank), int(world_size)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == '':
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f'environment variable {name}={value!r} is not an int') from None


# What a DataLoader passes on to its Loader (the Loader's own arguments).
_LOADER_ARGS = frozenset(inspect.signature(Loader).parameters) - {'reader'}


def check_sizes(batch_size, num_workers) -> None:
    """``batch_size`` and ``num_workers`` checked under torch's names (the Loader's own
    errors would name ``batch=`` and ``workers=``); ConfigError naming the bad value."""
    check_whole('batch_size', batch_size, 1, MAX_BATCH)
    if num_workers is not None and not (isinstance(num_workers, str) and num_workers == 'auto'):
        check_whole('num_workers', num_workers, 0, MAX_WORKERS, " or 'auto'")


def loader_args(kwargs: dict) -> dict:
    """``kwargs`` for the Loader: torch's names that mean nothing here refused (a
    TypeError that says the loadr way), torch's defaults dropped, torch's timeout=0
    (none) made the Loader's None."""
    out = {}
    for name, value in kwargs.items():
        if name in _TORCH_ONLY or name == 'in_order':
            # torch's default (None; in_order=True) is what loadr does anyway.
            if value is None or (name == 'in_order' and value is True):
                continue
            how = (_TORCH_ONLY[name] if name in _TORCH_ONLY
                   else 'loadr yields every batch in order, always')
            raise TypeError(f'loadr.torch.DataLoader does not take {name}=: {how}')
        if name not in _LOADER_ARGS:
            raise TypeError(f'DataLoader() got an unexpected keyword argument {name!r} '
                            f"(neither one of torch's DataLoader that loadr.torch takes "
                            f'nor one of loadr.Loader: {", ".join(sorted(_LOADER_ARGS))})')
        out[name] = value
    if out.get('timeout') == 0 and not isinstance(out['timeout'], bool):
        out['timeout'] = None           # torch's "no timeout"
    return out


def seed_of(seed, generator):
    """The seed: ``seed``, else ``generator.initial_seed()``, else 0."""
    if generator is None:
        return 0 if seed is None else seed
    if seed is not None:
        raise ConfigError('pass seed= or generator=, not both')
    if not isinstance(generator, torch.Generator):
        raise ConfigError(f'generator must be a torch.Generator, got {generator!r}')
    return generator.initial_seed()


def check_device(device):
    """``device`` as a ``torch.device``, None for the CPU (or none given); ConfigError
    for a name torch does not know, or CUDA where there is none."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f'device must name a torch device, got {device!r}') from exc
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ConfigError(f"device={str(device)!r} but CUDA is not available on this "
                          f"machine (torch {torch.__version__}); leave device=None to get "
                          f"CPU tensors")
    return None if device.type == 'cpu' else device
