"""What a source may implement: the protocols the loader checks once, when it is made.

A *source* is whatever a :class:`~loadr.Loader` reads: a list of dicts, a
reader of :mod:`loadr.readers`, a :class:`~loadr.mix.Mix`, a class of your
own. It needs :class:`Source` only (``len()`` and ``[i]``); each other
protocol below is optional, and a source that implements one says so by
naming it among its bases (``class MyReader(Reader, BatchSource)``):

================  ===========================================  =====================
protocol          members                                      who uses it
================  ===========================================  =====================
Source            ``__len__``, ``__getitem__(i) -> dict|tuple``  everything
BatchSource       ``read_batch(indices) -> list``              the assembler
SeededSource      ``read_seeded(index, seed) -> dict``         the assembler (a Mix)
ErrorNaming       ``name_error(exc, index)``                   the assembler (a Mix)
Prefetching       ``prefetches: bool``, ``prefetch(indices)``  assembler, worker
Caching           ``caches: bool``, ``cache_clock(order,       assembler, worker,
                  start, count)``, ``cache_flush()``           loader
Warming           ``warm(first)``, ``forked()``                 loader, worker
Ordering          ``make_order(seed, shuffle, version)``       order, loader
Identified        ``identity() -> dict``                       state, Mix
Composite         ``source_fns() -> {name: [fn, ...]}``        state, loader
Sharing           ``shared()``, ``release_shared(shared)``     loader (workers start)
Locating          ``where(index) -> str | None``               loader (its errors)
================  ===========================================  =====================

``prefetches`` and ``caches`` say whether the hook does anything for this
source (a reader's files are remote, or cached): a reader class implements
both protocols, an instance of it on local files uses neither.

Every protocol is ``runtime_checkable``, so ``isinstance(r, BatchSource)``
holds for a source with the members whether or not it names the protocol;
naming it is the declaration that ``tests/readers/common.py`` checks (the
members are the source's own, with the protocol's parameters). Code that
reads a source asks :func:`hooks_of` once, when it is made, and keeps the
bound methods it returns (None for a hook the source does not have or does
not use): nothing probes a source per batch.

>>> hooks = hooks_of([{'x': 1}])
>>> hooks.read_batch is None and hooks.make_order is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .errors import LoadrError

__all__ = ['Source', 'BatchSource', 'SeededSource', 'ErrorNaming', 'Prefetching', 'Caching',
           'Warming', 'Ordering', 'Identified', 'Composite', 'Sharing', 'Locating', 'OPTIONAL',
           'Hooks',
           'hooks_of', 'declared', 'members', 'one_by_one', 'file_of']


@runtime_checkable
class Source(Protocol):
    """``len(s)`` datapoints, ``s[i]`` a dict (or a tuple) for ``0 <= i < len(s)``."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@runtime_checkable
class BatchSource(Protocol):
    """Reads many datapoints at once: ``read_batch(indices)`` equals ``[s[i] for i in
    indices]``, faster. A read that fails is read again one by one (to name the index)."""

    def read_batch(self, indices) -> list: ...


@runtime_checkable
class SeededSource(Protocol):
    """A source whose datapoint depends on the sample's seed (a Mix applies its sources'
    own fns): the loader reads ``read_seeded(index, seed)``, not ``s[index]``."""

    def read_seeded(self, index: int, seed: int) -> Any: ...


@runtime_checkable
class ErrorNaming(Protocol):
    """Adds to an error of the loader's fns which part of the source ``index`` is in."""

    def name_error(self, exc: BaseException, index: int) -> None: ...


@runtime_checkable
class Prefetching(Protocol):
    """Can start reading datapoints ahead (remote files): a hint, when ``prefetches``."""

    # Read-only: the readers answer it with a property (their files are remote or not).
    @property
    def prefetches(self) -> bool: ...

    def prefetch(self, indices) -> None: ...


@runtime_checkable
class Caching(Protocol):
    """Keeps a local cache of remote records that learns the order (when ``caches``):
    ``cache_clock`` once per batch before its reads, ``cache_flush`` at the end."""

    @property
    def caches(self) -> bool: ...

    def cache_clock(self, order, start: int, count: int) -> None: ...

    def cache_flush(self) -> None: ...


@runtime_checkable
class Warming(Protocol):
    """Something a worker does once before its first task (a remote index read); the
    loader, where it forks its workers, does it for them with ``first``, the datapoints
    of the first batches, whose records it may read too (the workers inherit them), and
    calls ``forked()`` once they are forked (or failed to start): what was kept only
    for them can go."""

    def warm(self, first: Sequence[int] = ()) -> None: ...

    def forked(self) -> None: ...


@runtime_checkable
class Ordering(Protocol):
    """Makes its own order of the stream (:func:`loadr.order.order_for`)."""

    def make_order(self, seed: int, shuffle: bool = True, version: int = ...) -> Any: ...


@runtime_checkable
class Identified(Protocol):
    """A small JSON-able dict naming what is read: what a saved state is checked against."""

    def identity(self) -> dict: ...


@runtime_checkable
class Composite(Protocol):
    """Made of named sources with fns of their own (``{name: [fn, ...]}``, a nested one's
    as ``'outer/inner'``): they make the stream too, so a saved state digests them."""

    def source_fns(self) -> dict: ...


@runtime_checkable
class Sharing(Protocol):
    """Holds datapoints in Python objects that forked workers would copy page by page (a
    Mix's list sources): ``shared()`` is what the workers read instead, the same datapoints
    from shared memory (itself when there is nothing to share; :mod:`loadr.shared`), made
    when the first workers start; ``release_shared(shared)`` gives that memory back when
    the loader closes."""

    def shared(self) -> Any: ...

    def release_shared(self, shared) -> None: ...


@runtime_checkable
class Locating(Protocol):
    """Says which file (or URL) holds datapoint ``index``, or None where it cannot tell
    cheaply: the loader names it in the error of a datapoint that failed, and in the log
    line of one replaced under ``on_error='skip'`` (an error of the user's fns does not
    know the file it came from)."""

    def where(self, index: int) -> str | None: ...


#: The optional protocols, in the order of the table above.
OPTIONAL = (BatchSource, SeededSource, ErrorNaming, Prefetching, Caching, Warming, Ordering,
            Identified, Composite, Sharing, Locating)


def one_by_one(method):
    """Mark a ``read_batch`` that only reads one by one (a base class's loop): the
    assembler reads such a source one by one itself, which names a failing index at
    once instead of reading the batch twice."""
    method.one_by_one = True
    return method


def declared(cls: type) -> list[type]:
    """The optional protocols that ``cls`` names among its bases.

    >>> class R(BatchSource):
    ...     def read_batch(self, indices): return []
    >>> declared(R) == [BatchSource]
    True
    """
    mro = cls.__mro__
    return [p for p in OPTIONAL if p in mro]


def members(protocol: type) -> tuple[str, ...]:
    """The names a protocol asks for: its methods and its attributes.

    >>> members(Caching)
    ('caches', 'cache_clock', 'cache_flush')
    """
    names = list(protocol.__dict__.get('__annotations__', {}))
    names += [name for name, value in protocol.__dict__.items()
              if isinstance(value, property) or callable(value) and (
                  not name.startswith('_') or name in ('__len__', '__getitem__'))]
    return tuple(names)


class Hooks:
    """A source's hooks, looked up once: each a bound method, or None where the source
    does not have the hook or does not use it (``prefetches``/``caches`` false)."""

    __slots__ = ('read_batch', 'read_seeded', 'name_error', 'prefetch', 'cache_clock',
                 'cache_flush', 'warm', 'forked', 'make_order', 'identity', 'source_fns')

    # Each hook's bound method, or None (set by __init__ from the names above).
    read_batch: Callable[..., Any] | None
    read_seeded: Callable[..., Any] | None
    name_error: Callable[..., Any] | None
    prefetch: Callable[..., Any] | None
    cache_clock: Callable[..., Any] | None
    cache_flush: Callable[..., Any] | None
    warm: Callable[..., Any] | None
    forked: Callable[..., Any] | None
    make_order: Callable[..., Any] | None
    identity: Callable[..., Any] | None
    source_fns: Callable[..., Any] | None

    def __init__(self, **hooks):
        for name in self.__slots__:
            setattr(self, name, hooks.get(name))

    def __repr__(self) -> str:
        found = [name for name in self.__slots__ if getattr(self, name) is not None]
        return f'Hooks({", ".join(found)})'


def hooks_of(source) -> Hooks:
    """The optional hooks of ``source`` (see the module docstring), resolved once.

    >>> from loadr.mix import Mix
    >>> hooks = hooks_of(Mix({'a': [{'x': 0}]}))
    >>> hooks.read_seeded is not None, hooks.prefetch is None
    (True, True)
    """
    found: dict[str, Any] = {}
    if isinstance(source, BatchSource) \
            and not getattr(type(source).read_batch, 'one_by_one', False):
        found['read_batch'] = source.read_batch
    if isinstance(source, SeededSource):
        found['read_seeded'] = source.read_seeded
    if isinstance(source, ErrorNaming):
        found['name_error'] = source.name_error
    if isinstance(source, Prefetching) and source.prefetches:
        found['prefetch'] = source.prefetch
    if isinstance(source, Caching) and source.caches:
        found['cache_clock'] = source.cache_clock
        found['cache_flush'] = source.cache_flush
    if isinstance(source, Warming):
        found['warm'], found['forked'] = source.warm, source.forked
    for name, protocol in (('make_order', Ordering),
                           ('identity', Identified), ('source_fns', Composite)):
        if isinstance(source, protocol):
            found[name] = getattr(source, name)
    return Hooks(**found)


def file_of(source, index: int | None, exc: BaseException | None = None) -> str | None:
    """The file (or URL) that datapoint ``index`` of ``source`` comes from: the one a
    loadr error names, else the one the source says holds it (:class:`Locating`);
    None when neither can tell (a list of dicts). Never raises.

    >>> file_of([{'x': 1}], 0) is None
    True
    """
    path = getattr(exc, 'path', None) if isinstance(exc, LoadrError) else None
    if path is not None:
        return str(path)
    if index is None or not isinstance(source, Locating):
        return None
    try:
        where = source.where(index)
    except Exception:   # noqa: BLE001 - naming the file is a courtesy; the error is the news
        return None
    return where if isinstance(where, str) else None
