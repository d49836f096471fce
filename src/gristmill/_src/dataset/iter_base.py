"""Base classes of the streaming half: IterDataset (an Iterable) and DatasetIterator.

Minimal in this release: the bases (for Grain's subclassing contract) and what
``MapDataset.to_iter_dataset`` / iteration need. The IterDataset transformations arrive
with the iterator issue.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import copy
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from gristmill._src.checkpoint import files
from gristmill._src.core import grain_types, seeds, state_json
from gristmill._src.core import state as state_meta
from gristmill._src.core.dataset_options import IteratorContext
from gristmill._src.core.node_stats import NodeStats
from gristmill._src.dataset.base import MapDataset, op
from gristmill._src.engine.plan import Plan
from gristmill._src.engine.stats import PipelineStatistics

T = TypeVar("T")
S = TypeVar("S")


def _single_parent(owner: object, parents: tuple[Any, ...]) -> Any:
    if len(parents) != 1:
        raise ValueError(
            f"{type(owner).__name__} has {len(parents)} parents; _parent is only defined "
            "for exactly one — use _parents"
        )
    return parents[0]


class _IterDatasetMeta(abc.ABCMeta):
    """Holds the factories, so they exist on the class but not on instances (as upstream)."""

    def mix(
        cls,
        datasets: Sequence[IterDataset[Any]] | Mapping[str, IterDataset[Any]],
        weights: Sequence[float] | Mapping[str, float] | None = None,
    ) -> IterDataset[Any]:
        """Interleaves ``datasets`` in proportion to ``weights``; ends when one runs out.

        ``datasets`` is a sequence or a mapping of names to datasets; with a mapping,
        ``weights`` (a mapping too) is paired with it by name.
        """
        return op("iter.mix")(datasets, weights)  # type: ignore[no-any-return]


class IterDataset(Generic[T], grain_types.IterDataset, metaclass=_IterDatasetMeta):
    """A lazy, sequential dataset: ``iter(ds)`` returns a checkpointable DatasetIterator."""

    def __init__(self, parents: Any = ()) -> None:
        if isinstance(parents, (MapDataset, IterDataset)):
            parents = (parents,)
        self._parents: tuple[Any, ...] = tuple(parents)

    @property
    def parents(self) -> tuple[Any, ...]:
        """The datasets this one reads from."""
        return self._parents

    @property
    def _parent(self) -> Any:
        return _single_parent(self, self._parents)

    @property
    def _own_seed(self) -> int | None:
        return None

    @functools.cached_property
    def _default_seed(self) -> int | None:
        return seeds.derive_default_seed(
            self, lambda node: node.parents, lambda node: getattr(node, "_own_seed", None)
        )

    def _on_parents(self, parents: tuple[Any, ...]) -> IterDataset[T]:
        """A copy of this node reading ``parents`` instead (a worker's sliced sources, a
        later epoch of its MapDatasets).

        The copy keeps the default seed derived from the original graph. A node that keeps
        its inputs in another attribute too overrides this to put ``parents`` there.
        """
        self._default_seed  # noqa: B018 (derived from the original graph: the copy keeps it)
        clone = copy.copy(self)
        clone._parents = tuple(parents)
        return clone

    def pipe(self, func: Callable[..., S], /, *args: Any, **kwargs: Any) -> S:
        """Returns ``func(self, *args, **kwargs)``."""
        return func(self, *args, **kwargs)

    def mp_prefetch(
        self,
        options: Any = None,
        worker_init_fn: Callable[[int, int], Any] | None = None,
        sequential_slice: bool = False,
        *,
        backend: Any = None,
    ) -> IterDataset[T]:
        """Runs the pipeline's reads in worker processes (``options.num_workers``, default
        10; 0 returns ``self``), or on ``backend``'s actors (a ``gristmill.ray.RayBackend``);
        the output and the state are this dataset's, for any worker count (see
        ``gristmill._src.dataset.prefetch.mp_prefetch``)."""
        return op("mp_prefetch")(  # type: ignore[no-any-return]
            self, options, worker_init_fn, sequential_slice, backend=backend
        )

    def prefetch(self, multiprocessing_options: Any) -> IterDataset[T]:
        """Deprecated alias of :meth:`mp_prefetch` (as upstream)."""
        import warnings

        warnings.warn(
            "IterDataset.prefetch is deprecated; use mp_prefetch", DeprecationWarning, stacklevel=2
        )
        return self.mp_prefetch(multiprocessing_options)

    def seed(self, seed: int) -> IterDataset[T]:
        """Sets the default seed of every random op downstream."""
        return op("iter.seed")(self, seed)  # type: ignore[no-any-return]

    def map(self, transform: Any) -> IterDataset[Any]:
        """Applies a callable or ``transforms.Map`` to every element."""
        return op("iter.map")(self, transform)  # type: ignore[no-any-return]

    def random_map(self, transform: Any, *, seed: int | None = None) -> IterDataset[Any]:
        """Applies ``fn(x, rng)``; the generator depends on (seed, element count)."""
        return op("iter.random_map")(self, transform, seed)  # type: ignore[no-any-return]

    def map_with_index(self, transform: Any) -> IterDataset[Any]:
        """Applies ``fn(k, x)`` where ``k`` counts the elements this node has seen."""
        return op("iter.map_with_index")(self, transform)  # type: ignore[no-any-return]

    def filter(self, transform: Any) -> IterDataset[T]:
        """Keeps the elements where the predicate is true."""
        return op("iter.filter")(self, transform)  # type: ignore[no-any-return]

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[Sequence[T]], S] | None = None,
    ) -> IterDataset[S]:
        """Groups ``batch_size`` consecutive elements; leaves are stacked by default."""
        return op("iter.batch")(self, batch_size, drop_remainder, batch_fn)  # type: ignore[no-any-return]

    def apply(self, transformations: Any) -> IterDataset[Any]:
        """Applies a transformation object or a sequence of them, in order."""
        return op("apply")(self, transformations)  # type: ignore[no-any-return]

    @abc.abstractmethod
    def __iter__(self) -> DatasetIterator[T]:
        """A new iterator positioned at the start."""

    @property
    def _element_spec(self) -> Any:
        """The structure, shapes and dtypes of the elements, found without reading data."""
        raise NotImplementedError(
            f"element spec inference is not implemented for {type(self).__name__}; "
            "get_element_spec needs every node of the pipeline to support it"
        )

    def __str__(self) -> str:
        return type(self).__name__


async def _await_directory(directory: Any) -> Any:
    """A path for ``directory``; an Orbax PathAwaitingCreation is awaited first."""
    await_creation = getattr(directory, "await_creation", None)
    if await_creation is not None:
        await await_creation()
        return getattr(directory, "path", directory)
    return directory


class _SingleParent:
    """``DatasetIterator._parent`` when ``__init__`` did not set it: explains the problem.

    A non-data descriptor, so the instance attribute set by ``__init__`` takes precedence.
    """

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return _single_parent(obj, getattr(obj, "_parents", ()))


class ConsumerGuard:
    """Turns ``set_state()`` from another thread, while ``next()`` waits on background work,
    into a clear error instead of a race.

    ``next()`` holds the guard around its blocking wait (once per chunk, not per element);
    ``set_state`` takes it without blocking and raises if the iterating thread has it.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @property
    def waiting(self) -> threading.Lock:
        """Hold while ``next()`` waits for background work."""
        return self._lock

    @contextlib.contextmanager
    def repositioning(self, iterator: object) -> Iterator[None]:
        """Hold while ``set_state`` repositions; raises if ``next()`` is waiting."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                f"set_state() on {iterator} while another thread is inside next(): "
                "iterators are not thread-safe; call set_state() on the iterating thread, "
                "between next() calls"
            )
        try:
            yield
        finally:
            self._lock.release()


def mark_nested(iterator: Any) -> None:
    """Marks an iterator whose state is part of another's: it adds no metadata."""
    # An object that refuses attributes is not one of ours: it adds no metadata anyway.
    with contextlib.suppress(AttributeError):
        iterator._is_root = False


def share_context(iterator: Any, ctx: IteratorContext) -> None:
    """Makes ``iterator`` and its ancestors use ``ctx``."""
    pending = [iterator]
    while pending:
        node = pending.pop()
        if getattr(node, "_ctx", None) is ctx:
            continue
        with contextlib.suppress(AttributeError):
            node._ctx = ctx
        pending.extend(getattr(node, "_parents", ()))


def _joint_context(parents: Sequence[Any]) -> IteratorContext:
    """One context for an iterator and all its parents' trees (the first parent's wins)."""
    first: IteratorContext | None = getattr(parents[0], "_ctx", None) if parents else None
    ctx = IteratorContext() if first is None else first
    if first is None and parents:
        share_context(parents[0], ctx)
    for parent in parents[1:]:
        other = getattr(parent, "_ctx", None)
        if other is not ctx:
            if other is not None:
                ctx.merge(other)
            share_context(parent, ctx)
    return ctx


class DatasetIterator(Generic[T], abc.ABC):
    """An iterator with ``get_state()`` / ``set_state()``; ``close()`` releases resources."""

    def __init__(self, parents: DatasetIterator[Any] | Sequence[DatasetIterator[Any]] = ()) -> None:
        if isinstance(parents, DatasetIterator) or (
            hasattr(parents, "__next__") and not isinstance(parents, Sequence)
        ):  # one parent: ours, or any iterator with get_state/set_state (as Grain allows)
            parents = (parents,)
        self._parents: tuple[DatasetIterator[Any], ...] = tuple(parents)
        self._closed = False
        for parent in self._parents:
            mark_nested(parent)
        if len(self._parents) == 1:
            self._parent = self._parents[0]  # a plain attribute: read on every next()
        # The pipeline's options, shared by every iterator of the tree (WithOptionsIterDataset).
        self._ctx = _joint_context(self._parents)

    _parent: DatasetIterator[Any] = _SingleParent()  # type: ignore[assignment]
    _is_root = True  # False once another iterator's state includes this one's
    _pipeline_cache: state_meta.Pipeline | None = None

    @functools.cached_property
    def _stats(self) -> NodeStats:
        """Grain's recorder for subclasses: ``with self._stats.record_self_time(): ...``."""
        return NodeStats()

    def __iter__(self) -> DatasetIterator[T]:
        return self

    @abc.abstractmethod
    def __next__(self) -> T:
        """The next element; StopIteration at the end."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict describing the position after the last returned element."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to the position ``state`` describes."""

    def start_prefetch(self) -> None:
        """Starts background work early (no-op for iterators without any)."""

    def _next_up_to(self, count: int) -> list[T]:
        """The next ``count`` elements, fewer only at the end (``[]``: exhausted).

        Exactly what ``count`` calls of ``next()`` return, and the state after it is the
        state after the last of them: an error is raised as ``next()`` raises it (the
        elements taken before it in this call are dropped, as a loop of ``next()`` drops
        them). Consumers of many elements at once (``batch``) call it; an iterator that
        holds its elements in chunks overrides it to hand a slice over in one call instead
        of a method call per element.
        """
        elements: list[T] = []
        append = elements.append
        try:
            for _ in range(count):
                append(next(self))
        except StopIteration:
            pass
        return elements

    def plan(self) -> Plan:
        """The engine plan behind this iterator: the stages its parents run, upstream first,
        then its own (an iterator that runs none adds nothing). ``plan().configure(name,
        workers=…, buffer_size=…)`` changes a stage's settings while it runs; the elements
        and states stay the same (gristmill's; not part of Grain's API)."""
        return Plan.joined(p.plan() for p in self._parents if isinstance(p, DatasetIterator))

    def statistics(self) -> PipelineStatistics:
        """Snapshots of every stage's counters, upstream first (``plan().statistics()``)."""
        return self.plan().statistics()

    # -- positions by output count (experimental.get_next_index / set_next_index) -------

    # Why `_get_next_index` / `_set_next_index` raise here: shown in the NotImplementedError.
    _next_index_unsupported: ClassVar[str] = (
        "its position is not a count of outputs that can be reached without computing the "
        "elements before it (filter, packing, mix, interleave of several datasets)"
    )

    def _get_next_index(self) -> int:
        """How many elements this iterator has produced (the index of the next one).

        Override where the position is known without reading data; the default raises.
        """
        raise NotImplementedError(
            f"get_next_index is not supported by {type(self).__name__.lstrip('_')}: "
            f"{self._next_index_unsupported}; use get_state() / set_state() instead"
        )

    def _set_next_index(self, index: int) -> None:
        """Moves to output ``index`` without computing any element; the default raises."""
        raise NotImplementedError(
            f"set_next_index is not supported by {type(self).__name__.lstrip('_')}: "
            f"{self._next_index_unsupported}; use get_state() / set_state() instead"
        )

    # -- checkpoint metadata (see core/state.py) ----------------------------------------

    def _describe(self) -> str | None:
        """This node in the pipeline description; None for a transparent node (prefetch).

        Override to add structural parameters (a batch size, a length), never thread or
        buffer options: a state must restore under any of those.
        """
        return type(self).__name__

    def _pipeline(self) -> list[str]:
        """The descriptions of this node and its ancestors, depth first."""
        nodes: list[str] = []
        describe = getattr(self, "_describe", None)
        own = describe() if describe is not None else type(self).__name__
        if own is not None:
            nodes.append(own)
        for parent in getattr(self, "_parents", ()):
            nodes.extend(parent._pipeline() if isinstance(parent, DatasetIterator) else ())
        return nodes

    def _export_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` as ``get_state()`` returns it: with metadata when this is the root."""
        if not self._is_root:
            return state
        pipeline = self._pipeline_cache
        if pipeline is None:
            pipeline = self._pipeline_cache = state_meta.Pipeline(self._pipeline())
        return state_meta.with_metadata(state, pipeline)

    def _import_state(self, state: Any) -> Any:
        """``state`` given to ``set_state()``, checked and stripped of metadata at the root."""
        if not self._is_root:
            return state
        state_json.check_limits(state)  # before anything recurses into it, or repr()s it
        pipeline = self._pipeline_cache
        if pipeline is None:
            pipeline = self._pipeline_cache = state_meta.Pipeline(self._pipeline())
        return state_meta.without_metadata(state, pipeline)

    async def save(self, directory: Any) -> None:
        """Writes ``get_state()`` to ``directory/process_{i}-of-{n}.json`` (a coroutine).

        The state is taken when called; the file is written on a worker thread.
        ``directory`` is a path, or an Orbax ``PathAwaitingCreation`` (awaited first).
        """
        state = self.get_state()
        path = await _await_directory(directory)
        await asyncio.to_thread(files.write_state, path, state)

    async def load(self, directory: Any) -> None:
        """Restores the state saved by :meth:`save` in ``directory`` (a coroutine)."""
        path = await _await_directory(directory)
        self.set_state(await asyncio.to_thread(files.read_state, path))

    def close(self) -> None:
        """Releases resources held by this iterator and its parents; idempotent."""
        if self._closed:
            return
        self._closed = True
        for parent in self._parents:
            parent.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(
                f"Trying to advance a closed iterator: {self}; create a new one with iter(ds)"
            )

    def __enter__(self) -> DatasetIterator[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def bulk_puller(iterator: Any) -> Callable[[int], list[Any]]:
    """``iterator``'s :meth:`DatasetIterator._next_up_to`, or the same loop of ``next()``
    for an iterator from outside gristmill (Grain lets any iterator with ``get_state`` /
    ``set_state`` be a parent)."""
    own = getattr(iterator, "_next_up_to", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    return functools.partial(DatasetIterator._next_up_to, iterator)
