"""The Loader's state checks: what its states' fingerprint holds, whether a state
belongs to the loader, and going on from one (``save``/``load`` are
:class:`loadr.Loader`'s; the fields are :mod:`loadr.state`'s)."""

from __future__ import annotations

import logging

from . import state as state_fields
from .errors import StateError
from .sources import Composite

log = logging.getLogger('loadr')


def _source_fn_names(reader) -> dict:
    """``{source: [fn name, ...]}`` of a Mix's per-source fns (for a refused state's message)."""
    if not isinstance(reader, Composite):
        return {}
    return {name: [state_fields.fn_name(fn) for fn in chain]
            for name, chain in reader.source_fns().items()}


class LoaderState:
    """The state half of :class:`loadr.Loader` (a mixin: it reads the loader's settings)."""

    def _fingerprint(self) -> dict:
        # Kept: the reader's identity and the fns do not change under a loader,
        # and save() stays a dict copy (a few microseconds) at any step.
        if self._fingerprint_cache is None or self._fingerprint_cache['order'] != \
                self.order_version:
            self._fingerprint_cache = state_fields.fingerprint(
                self.reader, self.fns, self.n, self.shuffle, self.global_batch,
                self.order_version)
        return self._fingerprint_cache

    def _check_state(self, state: dict, strict: bool = True) -> tuple[dict, list]:
        """``(parsed state, what differs)``, or a StateError; touches nothing, so a refused
        state leaves the loader (and every iteration in progress) exactly as it was."""
        parsed = state_fields.parse(state)
        mine = {'seed': self.seed, **self._fingerprint()}
        diffs = state_fields.differences(parsed, mine,
                                         [state_fields.fn_name(fn) for fn in self.fns],
                                         _source_fn_names(self.reader))
        if diffs and strict:
            raise StateError('this state does not belong to this loader:\n  - '
                             + '\n  - '.join(diffs) + '\nCreate the Loader as it was when '
                             'the state was saved, or call load(state, strict=False) to go on '
                             "from the state's step with its seed and order anyway.")
        return parsed, diffs

    def _apply_state(self, parsed: dict, diffs: list) -> None:
        """Go on from a state :meth:`_check_state` accepted (nothing here can refuse it)."""
        for line in diffs:
            log.warning('loadr: load(strict=False) of a state that differs: %s', line)
        order = parsed.get('order', self.order_version)
        if order != self.order_version and (self.shuffle or self._hooks.make_order is not None):
            if not self._order_switch_logged:
                log.warning('loadr: the state was saved with order version %d (this loader: '
                            '%d); going on with order version %d, as its stream was made',
                            order, self.order_version, order)
                self._order_switch_logged = True
            self._set_order_version(order)
        self.step, self.seed = parsed['step'], parsed['seed']
        self._budget = tuple(parsed.get('skipped', (-1, 0, 0)))
        if self._window is not None:
            self._window.reset()        # every iterator goes on from the new step

    def _set_order_version(self, version: int) -> None:
        self.order_version = version
        self._orders.clear()
        # The workers and the inline window build their orders with the
        # version they were made with: make them again, lazily.
        self._close_window()
