"""A training job's data side, run by torchrun in tests/test_torchrun.py.

Every rank builds ``loadr.torch.DataLoader`` with no rank or world size (it
finds them in the gloo process group), iterates, all-reduces a number per
batch as DDP would (so a rank with fewer batches would hang the others), and
writes what it got to ``OUT/rank<r>.npz``; ``--save-after K`` writes each
rank's state after K batches to ``OUT/state<r>.json``; ``--resume FILE``
starts from a saved state; ``--fail-rank R`` makes one datapoint of rank R's
second batch raise, in a loadr worker.

Usage::

    torchrun --nproc_per_node=3 tests/dist/job.py --out /tmp/x --per-rank 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from loadr.torch import DataLoader
from tests.dist.data import FailOn, dataset, noisy

GROUP_TIMEOUT_S = 60


def make(args, fns=(noisy,), **kw):
    kw.setdefault('num_workers', args.workers)
    return DataLoader(dataset(args.n), batch_size=args.per_rank, fns=list(fns), seed=args.seed,
                      **kw)


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--out', required=True)
    p.add_argument('--n', type=int, default=23)
    p.add_argument('--per-rank', type=int, default=2)
    p.add_argument('--seed', type=int, default=5)
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--workers', type=int, default=0)
    p.add_argument('--save-after', type=int)
    p.add_argument('--resume')
    p.add_argument('--fail-rank', type=int)
    args = p.parse_args()
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    fns = [noisy]
    if args.fail_rank == rank:
        # The first datapoint of this rank's second batch is broken.
        with make(args, rank=rank, world_size=world, num_workers=0) as probe:
            it = iter(probe)
            next(it)
            fns = [FailOn(int(next(it)['label'][0]))]
    got, done = {}, 0
    with make(args, fns) as dl:
        assert (dl.rank, dl.world_size) == (rank, world), (dl.rank, dl.world_size)
        if args.resume:
            with open(args.resume) as f:
                dl.load_state_dict(json.load(f))
        for epoch in range(args.epochs):
            count = 0
            for batch in dl:
                # What DDP does each step: every rank must get here as often.
                size = torch.tensor([len(batch['label'])])
                dist.all_reduce(size)
                for key in ('label', 'vec'):
                    got[f'{epoch}/{count}/{key}'] = batch[key].numpy().copy()
                count += 1
                done += 1
                if done == args.save_after:
                    with open(os.path.join(args.out, f'state{rank}.json'), 'w') as f:
                        json.dump(dl.state_dict(), f)
            got[f'{epoch}/len'] = np.array([len(dl), count])
    np.savez(os.path.join(args.out, f'rank{rank}.npz'), **got)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
