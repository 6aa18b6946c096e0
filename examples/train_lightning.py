"""The tiny CNN of train_torch.py under Lightning; the data resumes through Lightning's checkpoint.

    python examples/train_lightning.py --dir /tmp/loadr-lightning --steps 40
    # kill it and run the same line again: fit() goes on from the newest
    # checkpoint, and the batches go on from the one that was due.

Nothing but the DataModule is loadr's: ``train_dataloader()`` returns a
``loadr.torch.DataLoader``. Lightning's fit loop stores the ``state_dict()``
of every train dataloader that has ``state_dict``/``load_state_dict`` in its
checkpoints and loads it back on ``fit(ckpt_path=...)``; since the DataLoader
has a ``len()``, Lightning fetches no batch ahead, so the stored state is
exactly the batch after the last one trained on (also at an epoch's end).

``--log FILE`` appends ``<global step> <sha256 of the batch>`` per step (tests).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import signal
import sys

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import make_pipeline, open_images, tiny_cnn  # noqa: E402

from loadr.torch import DataLoader  # noqa: E402


def batch_digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode() + batch[key].contiguous().numpy().tobytes())
    return h.hexdigest()


class DemoImages(L.LightningDataModule):
    """``loadr demo``'s synthetic JPEGs, made once, as batches of N x 3 x 56 x 56 tensors."""

    def __init__(self, data: str, batch_size: int = 16, workers: int = 2, images: int = 128):
        super().__init__()
        self.data, self.batch_size, self.workers, self.images = data, batch_size, workers, images

    def train_dataloader(self) -> DataLoader:
        return DataLoader(open_images(self.data, self.images), batch_size=self.batch_size,
                          fns=make_pipeline(), seed=0, num_workers=self.workers)


class Classifier(L.LightningModule):
    def __init__(self, log_path: str | None = None):
        super().__init__()
        self.net = tiny_cnn()
        self.log_path = log_path

    def training_step(self, batch, batch_idx):
        if self.log_path:
            with open(self.log_path, 'a') as f:
                f.write(f'{self.global_step + 1} {batch_digest(batch)}\n')
        return F.cross_entropy(self.net(batch['image']), batch['label'].long())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class KillAt(Callback):
    """SIGKILL the process after global step ``step`` (a pre-empted node, for tests)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def newest_checkpoint(directory: str) -> str | None:
    found = glob.glob(os.path.join(directory, '*.ckpt'))
    return max(found, key=os.path.getmtime) if found else None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True, help='checkpoint (and by default data) directory')
    p.add_argument('--data', help='the bag dataset (default DIR/images, made if missing)')
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--checkpoint-every', type=int, default=5)
    p.add_argument('--resume', help='a checkpoint to resume from (default: the newest in DIR)')
    p.add_argument('--kill-at', type=int, help='SIGKILL this process after that step (tests)')
    p.add_argument('--log', help='append "<step> <batch sha256>" per step to this file')
    args = p.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ckpt_dir = os.path.join(args.dir, 'checkpoints')
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.checkpoint_every,
                                 save_top_k=-1)]
    if args.kill_at:
        callbacks.append(KillAt(args.kill_at))
    trainer = L.Trainer(max_steps=args.steps, accelerator='cpu', devices=1, logger=False,
                        callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    data = DemoImages(args.data or os.path.join(args.dir, 'images'), args.batch_size,
                      args.workers)
    resume = args.resume or newest_checkpoint(ckpt_dir)
    trainer.fit(Classifier(args.log), datamodule=data, ckpt_path=resume)


if __name__ == '__main__':
    main()
