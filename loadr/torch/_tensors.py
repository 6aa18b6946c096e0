"""A batch's arrays as torch tensors: with no copy (:func:`to_torch`), page-locked
where they lie in the workers' shared memory (:class:`SlotPinner`), and on a
device. Imports torch (``import loadr`` never imports it)."""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch

# cudaHostRegister flags and the error it returns for a range registered already.
CUDA_HOST_REGISTER_DEFAULT = 0
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712

_convertible: dict = {}          # numpy dtype -> whether torch.from_numpy takes it


def as_tensor(value):
    """``value`` as a tensor sharing its memory if it is a numpy array torch can hold;
    anything else as it is."""
    if not isinstance(value, np.ndarray):
        return value
    ok = _convertible.get(value.dtype)
    if ok is None:
        try:
            out = torch.from_numpy(value)
        except (TypeError, ValueError):    # strings, objects, odd byte orders: keep numpy
            _convertible[value.dtype] = False
            return value
        _convertible[value.dtype] = True
        return out
    return torch.from_numpy(value) if ok else value


def to_torch(batch):
    """A batch with every numpy array as a tensor sharing its memory (no copy).

    Dicts, tuples and lists keep their shape; arrays torch cannot hold
    (strings, objects) and other values are left as they are.

    >>> to_torch({'x': np.arange(3), 'name': ['a', 'b', 'c']})
    {'x': tensor([0, 1, 2]), 'name': ['a', 'b', 'c']}
    """
    if isinstance(batch, dict):
        return {k: as_tensor(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(as_tensor(v) for v in batch)
    return as_tensor(batch)


def batch_values(batch):
    """The values of a batch: a dict's values, a tuple's or list's items, else the batch."""
    if isinstance(batch, dict):
        return batch.values()
    if isinstance(batch, (tuple, list)):
        return batch
    return (batch,)


def _root(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class SlotPinner:
    """Page-locks, once, each shared-memory slot of the live worker pool a lent batch
    lives in.

    A lent batch's arrays are views of one array over the whole slot
    (``WorkerPool.fresh_views``), whose base is the slot's mapping; the slots
    live as long as their pool, so registering each slot once
    (``cudaHostRegister``) makes every later batch in it pinned with no copy
    and no pin thread. A new pool (``workers='auto'`` settling, a load with
    another order version) maps new slots, possibly at the old addresses:
    :meth:`release` runs just before a pool is closed (the Loader's
    ``_before_pool_close``), so every registration is undone while its memory
    is still mapped, and :meth:`follow` makes the new pool's slots the ones
    that may be registered. Arrays that are not in a slot of the live pool
    (``num_workers=0``, a batch copied because the caller holds too many, the
    last batch of a pool closed under it) are pinned by a copy.

    ``register(address, nbytes) -> error code``, ``unregister(address)`` and
    ``copy(tensor) -> pinned tensor`` are CUDA's by default; they are the test
    hook: tests pass recording functions (``DataLoader._pin_functions``).
    """

    def __init__(self, register, unregister, copy=None):
        self._register, self._unregister = register, unregister
        self._copy = copy if copy is not None else (lambda t: t.pin_memory())
        self.pinned: dict[int, int] = {}     # address -> nbytes
        self.broken = False                  # registration failed: pin by copying
        self._pool = None                    # weak reference to the pool followed
        self._buffers: dict = {}             # id -> slot buffer of that pool (kept alive)

    def follow(self, pool) -> None:
        """Take the slots of ``pool`` (the loader's live pool, or None) as the ones to pin."""
        if pool is None or pool.closed:
            self._pool, self._buffers = None, {}
        elif self._pool is None or self._pool() is not pool:
            self._pool = weakref.ref(pool)
            # Held here, so an id cannot stand for another buffer while it is listed.
            self._buffers = {id(b): b for b in pool.slot_buffers()}

    def _pin_slot(self, root: np.ndarray) -> bool:
        if self._buffers.get(id(root.base)) is not root.base:
            return False                    # not a slot of the live pool
        address = root.__array_interface__['data'][0]
        if address in self.pinned:
            return True
        if self.broken:
            return False
        code = int(self._register(address, root.nbytes))
        if code not in (0, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED):
            self.broken = True
            warnings.warn(f'loadr: cudaHostRegister of a {root.nbytes}-byte shared-memory '
                          f'slot failed (CUDA error {code}); pinning each batch by a copy '
                          f'instead', RuntimeWarning, stacklevel=4)
            return False
        self.pinned[address] = root.nbytes
        return True

    def pin(self, host, tensors):
        """``tensors`` (from ``to_torch(host)``) with every tensor in page-locked memory."""
        copy = False
        for value in batch_values(host):
            if isinstance(value, np.ndarray) and value.size:
                root = _root(value)
                in_slot = root.base is not None and not isinstance(root.base, np.ndarray)
                if not (in_slot and self._pin_slot(root)):
                    copy = True
        if not copy:
            return tensors
        return _map_tensors(tensors, self._copy)

    def release(self) -> None:
        """Unregister every slot and follow no pool; before the loader unmaps them."""
        for address in list(self.pinned):
            self._unregister(address)
            del self.pinned[address]
        self._pool, self._buffers = None, {}

def _map_tensors(batch, fn):
    """``batch`` with ``fn`` applied to each tensor in it (other values as they are)."""
    def one(value):
        return fn(value) if isinstance(value, torch.Tensor) else value
    if isinstance(batch, dict):
        return {k: one(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(one(v) for v in batch)
    return one(batch)


def to_device(tensors, device):
    """``tensors`` (a batch) with each tensor copied to ``device`` without blocking."""
    return _map_tensors(tensors, lambda t: t.to(device, non_blocking=True))
