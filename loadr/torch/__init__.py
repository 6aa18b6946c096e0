"""PyTorch adapter: ``loadr.torch.DataLoader``, epochs of torch tensors, resumable.

Imported explicitly (``import loadr`` never imports torch)::

    from loadr.torch import DataLoader
    dl = DataLoader(reader, batch_size=64, fns=[preproc], num_workers=8)
    for epoch in range(epochs):
        for batch in dl:                 # one epoch per iter(dl); len(dl) batches
            train_step(batch)            # a dict of torch tensors
    torch.save({'model': model.state_dict(), 'data': dl.state_dict()}, 'ckpt.pt')

It wraps a :class:`loadr.Loader` (``batch=batch_size`` per rank,
``shard_id=rank``, ``num_shards=world_size``) and gives it torch's shape:

- **Epochs.** Each ``iter(dl)`` is one epoch, and epochs advance by
  themselves (nothing like ``sampler.set_epoch``). A new ``iter(dl)`` after
  breaking out of an epoch starts the next epoch, as torch's DataLoader does.
- **Ranks.** Every rank yields ``len(dl)`` batches per epoch. Each global
  batch of ``batch_size * world_size`` stream positions is split between the
  ranks with no sample twice (no padding by repetition, unlike
  DistributedSampler). With ``drop_last=False`` the last global batch of an
  epoch is short: it is split evenly, so on every rank the last batch is
  short, and on some ranks *empty* (zero rows) when fewer samples than ranks
  remain; it is never missing, so a DDP all-reduce never waits on a rank that
  has finished. Code that averages per batch should weigh by the batch size.
- **Zero copy.** Arrays become tensors with ``torch.from_numpy`` on the batch
  lent from the workers' shared memory; list keys (strings, ragged values)
  stay Python lists.
- **Resume.** ``state_dict()`` / ``load_state_dict()`` (torchdata's
  StatefulDataLoader protocol): a small JSON dict, the same on every rank;
  after a load the next batch is the one that was due, mid-epoch too. It
  resumes bit for bit with another ``num_workers``, and with another
  ``world_size`` as long as ``batch_size * world_size`` stays the same.
  A state taken *inside* the loop after the last batch of an epoch resumes
  with an empty epoch (the rest of that epoch), then the next one; a state
  taken *after* the loop resumes with the next epoch: both exactly as
  torchdata's StatefulDataLoader (its ``TestEndOfEpochBehavior``).
"""

from ._args import rank_and_world_size
from ._dataloader import STATE_VERSION, WAIT_RANGE, DataLoader
from ._tensors import to_torch

__all__ = ['DataLoader', 'rank_and_world_size', 'to_torch', 'STATE_VERSION', 'WAIT_RANGE']
