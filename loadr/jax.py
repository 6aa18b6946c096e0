"""JAX adapter: global ``jax.Array`` batches, each process loading only its rows.

Imported explicitly (``import loadr`` never imports jax)::

    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from loadr.jax import global_batches

    jax.distributed.initialize()                 # on every host
    mesh = Mesh(jax.devices(), ('data',))
    batches = global_batches(reader, NamedSharding(mesh, P('data')), batch_size=256)
    for step, batch in zip(range(steps), batches):
        state = train_step(state, batch)         # batch['image']: a global jax.Array

Each process works out from the sharding which rows of the global batch its
devices hold, loads just those (a :class:`loadr.Loader` shard), and builds
every global array with ``jax.make_array_from_process_local_data``. The
stream is the Loader's endless one (every batch full), the same on any
number of processes for the same global batch.

The iterator state is the Loader's: small JSON, the same on every process.
Save and restore it with Orbax's checkpoint manager beside the model::

    import orbax.checkpoint as ocp
    mngr.save(step, args=ocp.args.Composite(model=ocp.args.StandardSave(params),
                                            data=ocp.args.JsonSave(batches.state())))
    restored = mngr.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(params), data=ocp.args.JsonRestore()))
    batches.restore(restored['data'])            # the next batch is the one that was due

(without Orbax: store ``batches.state()`` as JSON anywhere, ``restore()`` it).
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from .errors import ConfigError
from .loader import MAX_BATCH, Loader

__all__ = ['global_batches', 'GlobalBatches', 'local_rows']


def local_rows(sharding, global_shape: tuple) -> tuple[int, int]:
    """``(start, stop)``: the rows of a global batch this process's devices hold.

    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> local_rows(NamedSharding(Mesh(jax.devices(), ('d',)), P('d')), (8, 3))
    (0, 8)
    """
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
        first = index[0] if index else slice(None)
        rows.update(range(*first.indices(global_shape[0])))
    start, stop = min(rows), max(rows) + 1
    if len(rows) != stop - start:
        raise ConfigError(f'this process holds rows {sorted(rows)} of the global batch: loadr '
                          f'needs them contiguous; order the mesh devices by process')
    return start, stop


class GlobalBatches:
    """Dicts of global ``jax.Array`` from a Loader shard; see :func:`global_batches`.

    List keys (strings, ragged values) stay this process's Python lists.
    """

    def __init__(self, loader: Loader, sharding, global_batch: int):
        self.loader, self.sharding, self.global_batch = loader, sharding, global_batch
        self._it: Iterator[dict] | None = None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        it = self._it
        if it is None:
            it = self._it = iter(self.loader)
        local = next(it)
        out = {}
        for key, value in local.items():
            if isinstance(value, np.ndarray):
                out[key] = jax.make_array_from_process_local_data(
                    self.sharding, value, (self.global_batch, *value.shape[1:]))
            else:
                out[key] = value
        return out

    def state(self) -> dict:
        """Where the stream goes on from: small JSON, the same on every process."""
        return self.loader.save()

    def restore(self, state: dict) -> None:
        """Go on from ``state`` (from :meth:`state`, saved on any number of processes
        with the same global batch): the next batch is the one that was due."""
        self.loader.load(state)

    def close(self) -> None:
        self.loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def global_batches(source, sharding, batch_size: int | None = None, **loader_kwargs):
    """Global batches of ``batch_size`` rows as ``jax.Array``s laid out by ``sharding``.

    Args:
      source: a reader (then ``batch_size``, the global batch, is required and
        ``loader_kwargs`` go to :class:`loadr.Loader`: ``fns``, ``seed``,
        ``workers``, ...), or a Loader already made for this process's rows
        (``batch`` = rows per process, ``shard_id``/``num_shards`` to match).
      sharding: a ``jax.sharding.Sharding`` of the batch arrays, e.g.
        ``NamedSharding(mesh, P('data'))`` (split the rows) or ``P()`` (every
        process loads the whole batch).

    Example (one process):

    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> sharding = NamedSharding(Mesh(jax.devices(), ('data',)), P('data'))
    >>> data = [{'x': np.float32(i)} for i in range(10)]
    >>> with global_batches(data, sharding, batch_size=4, workers=0) as batches:
    ...     next(batches)['x'].shape
    (4,)
    """
    if isinstance(source, Loader):
        if loader_kwargs:
            raise ConfigError(f'a Loader was given: its arguments are set already, not '
                              f'{sorted(loader_kwargs)}')
        global_batch = source.global_batch if batch_size is None else batch_size
    elif batch_size is None:
        raise ConfigError('batch_size (the global batch) is required with a reader')
    else:
        global_batch = batch_size
    if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) \
            or not 1 <= global_batch <= MAX_BATCH:
        raise ConfigError(f'batch_size must be an int in [1, {MAX_BATCH}], got '
                          f'{global_batch!r}')
    # Only the rows matter here; other dimensions get a size every mesh axis divides.
    ndim = max(1, len(getattr(sharding, 'spec', None) or ()))
    devices = len(sharding.device_set)
    start, stop = local_rows(sharding, (int(global_batch),) + (devices,) * (ndim - 1))
    local = stop - start
    if global_batch % local or start % local:
        raise ConfigError(f'this process holds rows [{start}, {stop}) of a global batch of '
                          f'{global_batch}: loadr splits a batch into equal blocks')
    shard_id, num_shards = start // local, global_batch // local
    if isinstance(source, Loader):
        if (source.batch, source.shard_id, source.num_shards) != (local, shard_id, num_shards):
            raise ConfigError(
                f'the sharding puts rows [{start}, {stop}) of {global_batch} on this process: '
                f'make the Loader with batch={local}, shard_id={shard_id}, '
                f'num_shards={num_shards} (it has batch={source.batch}, '
                f'shard_id={source.shard_id}, num_shards={source.num_shards})')
        loader = source
    else:
        for name in ('batch', 'shard_id', 'num_shards'):
            if name in loader_kwargs:
                raise ConfigError(f'global_batches sets {name!r} from the sharding itself')
        loader = Loader(source, batch=local, shard_id=shard_id, num_shards=num_shards,
                        **loader_kwargs)
    return GlobalBatches(loader, sharding, int(global_batch))
