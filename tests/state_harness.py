"""One save/load harness for every stateful thing in loadr (after torchdata's
``run_test_save_load_state``).

:func:`run_save_load_state` takes a :class:`Stateful`: how to make the thing
for a worker count, and how to save, load and iterate one epoch of it. It
checks, for every worker count given:

- *interrupt at every step*: the state taken after each batch (JSON round
  trip) makes a fresh object go on with exactly the batches that followed,
  through the end of the run, for every loading worker count; the states
  themselves are the same for every saving worker count;
- *state before iteration*: the state of an object that has yielded nothing
  gives the whole run;
- *end of epoch*: the state taken after the last batch of an epoch gives the
  next epoch (the points at the end of each epoch are among the above);
- *multi-epoch*: the run spans ``epochs`` epochs;
- each state is JSON, under ``max_state_bytes``, and ``load(save())`` in the
  middle of a run changes nothing.

Example (the Loader; the torch adapter would pass ``state_dict`` /
``load_state_dict`` and ``epoch=iter``)::

    run_save_load_state(Stateful(
        make=lambda workers: loadr.Loader(data, batch=5, workers=workers),
        epoch=lambda loader: loader.epoch(loader.step // loader.n)))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .loader_helpers import batch_digest

__all__ = ['Stateful', 'run_save_load_state']


def _save(obj) -> dict:
    return obj.save()


def _load(obj, state: dict) -> None:
    obj.load(state)


def _close(obj) -> None:
    obj.close()


@dataclass
class Stateful:
    """How the harness drives one kind of stateful thing."""

    make: Callable[[int], Any]                       # workers -> a fresh object
    epoch: Callable[[Any], Iterable]                 # obj -> the batches of its next epoch
    save: Callable[[Any], dict] = _save
    load: Callable[[Any, dict], None] = _load
    close: Callable[[Any], None] = _close
    digest: Callable[[Any], str] = batch_digest
    # True when `epoch` is a fixed number of batches of an endless stream: a
    # resumed run may then go past the end of the reference run.
    endless: bool = False


def _round_trip(state: dict, max_bytes: int) -> dict:
    text = json.dumps(state)
    assert len(text.encode()) < max_bytes, f'state of {len(text)} bytes: {text[:200]}'
    return json.loads(text)


def _run(thing: Stateful, obj, epochs: int, max_bytes: int, reload_at: int | None = None):
    """Every batch's digest for ``epochs`` epochs, and the state before and after each."""
    states = [_round_trip(thing.save(obj), max_bytes)]
    digests = []
    for _ in range(epochs):
        for batch in thing.epoch(obj):
            digests.append(thing.digest(batch))
            del batch
            states.append(_round_trip(thing.save(obj), max_bytes))
            if len(digests) == reload_at:
                thing.load(obj, thing.save(obj))
    return digests, states


def run_save_load_state(thing: Stateful, worker_counts=(0, 1, 2), epochs: int = 2,
                        max_state_bytes: int = 1024) -> dict:
    """Run every check of the module docstring; returns what it covered (for the test)."""
    runs = {}
    for workers in worker_counts:
        obj = thing.make(workers)
        try:
            # One of the runs also loads its own state halfway: that changes nothing.
            reload_at = 3 if workers == worker_counts[-1] else None
            runs[workers] = _run(thing, obj, epochs, max_state_bytes, reload_at)
        finally:
            thing.close(obj)
    expected, states = runs[worker_counts[0]]
    assert expected, 'the run yielded no batch'
    for workers, (digests, their_states) in runs.items():
        assert digests == expected, f'workers={workers} gives other batches than ' \
                                    f'workers={worker_counts[0]}'
        # A state is a pure function of the position: the same for any worker
        # count, so resuming from one run's states covers every saving count.
        assert their_states == states, f'workers={workers} saves other states'
    resumed = 0
    for loaded_with in worker_counts:
        for k, state in enumerate(states):
            obj = thing.make(loaded_with)
            try:
                thing.load(obj, state)
                rest = []
                while len(rest) < len(expected) - k:
                    got = [thing.digest(b) for b in thing.epoch(obj)]
                    assert got, f'no batch after a state taken after {k} batches'
                    rest += got
            finally:
                thing.close(obj)
            if thing.endless:
                rest = rest[:len(expected) - k]
            assert rest == expected[k:], (
                f'the state taken after {k} batches, loaded with workers={loaded_with}, goes '
                f'on with other batches')
            resumed += 1
    return {'batches': len(expected), 'resumed': resumed}
