"""Train a tiny CNN with loadr.torch.DataLoader; kill it anywhere, run it again.

    python examples/train_torch.py --dir /tmp/loadr-example --steps 40
    # kill it (Ctrl-C, SIGKILL, a pre-empted node) and run the same line again:
    # it goes on from the last checkpoint and ends with the very same weights
    # as a run that was never stopped (also with another --workers).

The data is ``loadr demo``'s: synthetic 192x256 JPEGs of 10 classes, written
once as a bag dataset under ``DIR/images`` (loadr.demo.make_images). The
pipeline decodes at a short side of 64, takes a random 56x56 crop, flips,
normalises; the model sees N x 3 x 56 x 56 float tensors straight from the
workers' shared memory. A checkpoint holds the model, the optimiser, the
step and ``dl.state_dict()`` (a few hundred bytes), written atomically.
The last line printed is the sha256 of the final weights.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal

import torch
import torch.nn.functional as F
from torch import nn

import loadr
from loadr import fns
from loadr.demo import make_images
from loadr.torch import DataLoader


def tiny_cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))


def open_images(path: str, images: int = 128):
    """The demo's bag of JPEGs at ``path``, written first if it is not there."""
    if not os.path.isdir(path):
        make_images(path, n=images)
    return loadr.open(path, decode_images=False, cache_keys=['refs', 'label'])


def make_pipeline() -> list:
    return [fns.decode_jpeg(size=64), fns.random_resized_crop(size=(56, 56)), fns.flip(),
            fns.normalize(mean='imagenet', std='imagenet', layout='CHW')]


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_atomically(obj, path: str) -> None:
    # A kill during the write leaves the previous checkpoint whole.
    tmp = f'{path}.tmp-{os.getpid()}'
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True, help='checkpoint (and by default data) directory')
    p.add_argument('--data', help='the bag dataset (default DIR/images, made if missing)')
    p.add_argument('--images', type=int, default=128)
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--checkpoint-every', type=int, default=5)
    p.add_argument('--kill-at', type=int, help='SIGKILL this process after that step (tests)')
    args = p.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)              # the same float sums on every run
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.dir, exist_ok=True)
    reader = open_images(args.data or os.path.join(args.dir, 'images'), args.images)
    dl = DataLoader(reader, batch_size=args.batch_size, fns=make_pipeline(), seed=0,
                    num_workers=args.workers)
    model = tiny_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    ckpt = os.path.join(args.dir, 'checkpoint.pt')
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state['model'])
        opt.load_state_dict(state['optimizer'])
        dl.load_state_dict(state['data'])
        step = state['step']
        print(f'resumed at step {step} (epoch {state["data"]["epoch"]})', flush=True)

    with dl:
        while step < args.steps:
            for batch in dl:                  # one epoch; the next iter() is the next one
                loss = F.cross_entropy(model(batch['image']), batch['label'].long())
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if step % args.checkpoint_every == 0:
                    save_atomically({'model': model.state_dict(), 'optimizer': opt.state_dict(),
                                     'step': step, 'data': dl.state_dict()}, ckpt)
                    print(f'step {step}: loss {loss.item():.4f}, checkpoint saved', flush=True)
                if step == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step >= args.steps:
                    break
    digest = weights_digest(model)
    print(f'weights sha256 {digest}')
    return digest


if __name__ == '__main__':
    main()
