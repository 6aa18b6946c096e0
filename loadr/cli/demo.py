"""``loadr demo``: synthetic JPEGs, the demo pipeline with workers, and a resume check."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time

from ..progress import Progress, format_count
from .common import EXIT_FAILED, EXIT_OK, batch_size, epoch_batches, plural, print_out, size_text

DEMO_RESUME_AFTER = 20    # batches before the demo saves its state


def cmd_demo(args) -> int:
    """Synthetic JPEGs, the demo pipeline with workers, and a resume check: ``loadr demo``."""
    from ..config import pipeline
    from ..demo import DATA_DIR_NAME, DEMO_YAML, DEMO_YAML_PATH, IMAGE_HW, batch_digest, make_images
    tmp = tempfile.mkdtemp(prefix='loadr-demo-')
    yaml_path = os.path.join(tmp, 'demo.yaml')
    try:
        data = os.path.join(tmp, DATA_DIR_NAME)
        t0 = time.perf_counter()
        print_out(f'1. Writing {args.images} synthetic {IMAGE_HW[0]}x{IMAGE_HW[1]} JPEG images '
                  f'(10 labels) as a bag dataset: {data}')
        size = make_images(data, n=args.images)
        print_out(f'   {args.images} datapoints, {size_text(size)}, in '
                  f'{time.perf_counter() - t0:.1f} s')
        with open(yaml_path, 'w', encoding='utf-8') as f:
            f.write(DEMO_YAML)
        print_out(f'2. The pipeline ({yaml_path}, the same as {DEMO_YAML_PATH}):')
        for line in DEMO_YAML.splitlines():
            if line and not line.startswith('#'):
                print_out(f'     {line}')
        overrides = {'loader.workers': args.workers}
        with pipeline(yaml_path, **overrides) as loader:
            steps = max(DEMO_RESUME_AFTER + 1, 2 * epoch_batches(loader))
            print_out(f'3. Running {steps} batches of {loader.batch} ({steps * loader.batch} '
                      f'samples, {steps * loader.batch / len(loader.reader):.0f} epochs) with '
                      f'{loader.workers} worker processes:')
            bar = Progress(total=steps, unit='batches', label='   demo')
            it = iter(loader)
            state: dict | None = None
            expected: str | None = None
            first: dict | None = None
            for k in range(steps):
                batch = next(it)
                first = first or {key: (v.dtype, v.shape) for key, v in batch.items()}
                if k == DEMO_RESUME_AFTER - 1:
                    state = loader.save()
                elif k == DEMO_RESUME_AFTER:
                    expected = batch_digest(batch)
                bar.update(1, samples=batch_size(batch))
            bar.close()
            rate, sample_rate = bar.rates()
        # More steps than DEMO_RESUME_AFTER: the state and the digest to compare were taken.
        assert first is not None and state is not None and expected is not None
        print_out(f'   {bar.samples} samples in {bar.elapsed:.2f} s: {format_count(sample_rate)} '
                  f'samples/s, {rate:.1f} batches/s')
        print_out('   a batch: ' + ', '.join(f'{k} {d}{list(s)}' for k, (d, s) in first.items()))
        other = 1 if args.workers != 1 else 0
        print_out(f'4. Resume: the state saved after batch {DEMO_RESUME_AFTER} is '
                  f'{json.dumps(state)}')
        with pipeline(yaml_path, **{'loader.workers': other}) as fresh:
            fresh.load(state)
            got = batch_digest(next(iter(fresh)))
        same = got == expected
        print_out(f'   a fresh loader ({plural(other, "worker")}) that loads it gives batch '
                  f'{DEMO_RESUME_AFTER + 1}: sha256 {got[:16]}… vs {expected[:16]}… in the first '
                  f'run: {"the same batch" if same else "DIFFERENT (a bug: please report it)"}')
        return EXIT_OK if same else EXIT_FAILED
    finally:
        # The installed copy of the pipeline: a path that exists wherever this runs.
        own = f'loadr run {shlex.quote(DEMO_YAML_PATH)} -o reader.path=YOUR_BAG'
        if args.keep:
            print_out(f'5. Kept {tmp} (remove it when done). Next:')
            print_out(f'     loadr run {shlex.quote(yaml_path)}    # this dataset again')
            print_out(f'     {own}    # your own bag of images')
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            print_out(f'5. Removed {tmp}. Next, on your own bag of images:')
            print_out(f'     {own}')
