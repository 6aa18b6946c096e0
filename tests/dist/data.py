"""The dataset and fns of tests/dist/job.py, in a module of their own so that they
have the same names in the job (run as ``__main__``) and in the test that checks it
(a state's fingerprint names the fns)."""

from __future__ import annotations

import numpy as np


def dataset(n: int) -> list[dict]:
    return [{'label': i, 'vec': np.full(4, i, np.float32)} for i in range(n)]


def noisy(dp, seed):
    rng = np.random.default_rng(seed)
    return {'label': dp['label'], 'vec': dp['vec'] + rng.standard_normal(4).astype(np.float32)}


class FailOn:
    """``noisy``, but datapoint ``label`` raises (a bad record on one rank)."""

    def __init__(self, label: int):
        self.label = label

    def __call__(self, dp, seed):
        if dp['label'] == self.label:
            raise ValueError(f'datapoint {self.label} is broken')
        return noisy(dp, seed)
