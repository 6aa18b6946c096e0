"""Mixing datasets: exact proportions, every sample once per source epoch, resumable anywhere.

A :class:`Mix` is a reader made of named sources. Position ``p`` of the
stream goes to a source chosen by a fixed schedule of the weights. It holds
that source's datapoint at the source's own stream position: how many
earlier positions went to the same source. Each source runs its own epochs.
Source epoch ``e`` is a permutation keyed by (seed, source name, e), made by
:class:`loadr.order.Order`. A small source simply cycles more epochs than a
large one. Everything is a pure function of (seed, p), so ``load()`` at
step 10^12 costs what step 0 does.

The schedule works in blocks of :data:`BLOCK` = 1,024 positions (aligned to
multiples of 1,024). Write ``1024 * w_s = b_s + f_s`` with ``b_s`` an integer
and ``0 <= f_s < 1``. Every block gives source ``s`` either ``b_s`` or
``b_s + 1`` positions. The ``R = sum(f_s)`` extra positions of a block go to
``R`` distinct sources by McNaughton's wrap-around rule:

- lay the ``f_s`` end to end on a circle of length ``R``;
- put ``R`` points one apart, turned by ``frac(k * g / Q)`` for block ``k``;
- a source gets an extra where a point falls on its arc.

Here ``Q`` is the common denominator of the ``f_s``. ``g`` lies near
``Q / phi`` and is chosen so that ``g / Q`` has small partial quotients,
which spreads the turns evenly (see :func:`~loadr.mix._weights.rotation`). How
many extras a source had before block ``k`` is a floor sum, computed in
O(log Q). Inside a block, the quotas are interleaved by the Sainte-Laguë rule
(the ``i``-th datapoint of source ``s`` sits at time ``(i + 1/2) / q_s``;
positions follow the times).

So every aligned window of 1,024 positions holds ``floor(1024 w)`` or
``ceil(1024 w)`` samples of each source (by construction). The other bounds
were measured, not proved (tests/test_mix.py checks them). A window of 1,024
consecutive positions was off by less than 2. The running count stayed within
about 3 samples of ``w * p`` over the first 10^6 positions. Out to 10^13
positions it stayed within about 5 for unrelated weights, and within 2 for
simple ones (0.8/0.2, 0.999/0.001), whose schedule repeats exactly.

Each weight is read as the nearest fraction with a denominator of at most
10^6 (0.8 is 4/5), and weights are normalised by their sum (exactly: see
:func:`~loadr.mix._weights.normalise`). The schedule is built once, when the Mix is made
(10,000 sources with unrelated weights: about 0.15 s, ``python -m
benchmarks.mix_build``); its orders, and the workers, which get it with the
Mix, use it as built. A weight
schedule ``[(0, {...}), (position, {...}), ...]`` starts a new schedule at
each change point. Each source's count at the change point carries over, so
the stream before a change point does not depend on what comes after it.

Composite indices: the mix's datapoint ``i`` is datapoint ``i - offset[s]``
of source ``s``, with the sources laid end to end in the order given, so
``len(mix)`` is the sum of the sources' sizes (the Loader's nominal epoch).

Example::

    mix = loadr.Mix({'web': loadr.open('web/'), 'curated': loadr.open('curated.ffr')},
                    weights={'web': 0.8, 'curated': 0.2})
    loader = loadr.Loader(mix, batch=64, seed=0, workers=8)
"""

from ._mix import Mix
from ._order import MixOrder
from ._weights import BLOCK

__all__ = ['Mix', 'MixOrder', 'BLOCK']
