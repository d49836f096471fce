"""The lazy dataset graph's base classes: MapDataset (random access) and its registry.

A MapDataset is a Sequence-like node: ``len(ds)`` is one epoch, ``ds[i]`` reads any integer
index (``i`` past the end reads later epochs). Built-in nodes implement two internal reads:

* ``_get(index)``: one element, ``index`` an already validated ``int``;
* ``_read(indices)``: a whole chunk, ``indices`` an int64 numpy array — index arithmetic is
  vectorised over the chunk and sources are asked once per chunk.

User subclasses (Grain's subclassing contract) implement ``__len__`` and ``__getitem__``
only, optionally ``_getitems``; the base class adapts them to both internal reads.

The fluent methods (``ds.shuffle()``, ``ds.map()``, …) look their node class up in a
registry that each transformation module fills when imported, so this module imports none
of them.
"""

from __future__ import annotations

import abc
import copy
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

import numpy as np
import numpy.typing as npt

from gristmill._src.core import grain_types, seeds, validation
from gristmill._src.core.node_stats import NodeStats
from gristmill._src.dataset.op_clock import timed_read

if TYPE_CHECKING:
    from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset

T = TypeVar("T")
S = TypeVar("S")
IndexArray = npt.NDArray[np.int64]

_OPS: dict[str, Callable[..., Any]] = {}


F = TypeVar("F", bound=Callable[..., Any])


def register(name: str) -> Callable[[F], F]:
    """Makes a node class available to the fluent method (or factory) called ``name``."""

    def add(cls: F) -> F:
        if name in _OPS:
            raise RuntimeError(f"dataset operation {name!r} registered twice")
        _OPS[name] = cls
        return cls

    return add


def op(name: str) -> Callable[..., Any]:
    try:
        return _OPS[name]
    except KeyError:
        raise RuntimeError(
            f"dataset operation {name!r} is not registered; import gristmill (the package), "
            "not gristmill._src.dataset.base alone"
        ) from None


def as_index_array(indices: Sequence[int] | npt.NDArray[Any]) -> IndexArray:
    """Validates a batch of indices into an int64 array (TypeError for non-integers)."""
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iub" and arr.size:
        items = arr.ravel().tolist() if isinstance(indices, np.ndarray) else indices
        return np.array([validation.check_index(i) for i in items], dtype=np.int64)
    return arr.astype(np.int64, copy=False).ravel()


def empty_read(node: object, indices: IndexArray) -> list[Any]:
    """What reading ``indices`` from an empty (length 0) dataset gives: nothing, or IndexError."""
    if not indices.size:
        return []
    raise validation.empty_dataset_error(node, int(indices[0]))


class _MapDatasetMeta(abc.ABCMeta):
    """Holds the factories, so they exist on the class but not on instances (as upstream)."""

    def source(cls, source: Any) -> MapDataset[Any]:
        """A dataset over a Sequence or RandomAccessDataSource: ``ds[i] = source[i % len]``."""
        return op("source")(source)  # type: ignore[no-any-return]

    def range(cls, start: int, stop: int | None = None, step: int = 1) -> MapDataset[int]:
        """Like builtin ``range``: ``ds[i] = start + (i % len) * step``."""
        return op("range")(start, stop, step)  # type: ignore[no-any-return]

    def mix(
        cls, datasets: Sequence[MapDataset[Any]], weights: Sequence[float] | None = None
    ) -> MapDataset[Any]:
        """Interleaves ``datasets`` deterministically in proportion to ``weights``."""
        return op("mix")(datasets, weights)  # type: ignore[no-any-return]

    def concatenate(cls, datasets: Sequence[MapDataset[Any]]) -> MapDataset[Any]:
        """One epoch is every dataset's epoch, one after another."""
        return op("concatenate")(datasets)  # type: ignore[no-any-return]

    def select_from_datasets(
        cls, datasets: Sequence[MapDataset[Any]], selection_map: Any
    ) -> MapDataset[Any]:
        """``ds[i] = datasets[d][j]`` where ``(d, j) = selection_map[i]``."""
        return op("select_from_datasets")(datasets, selection_map)  # type: ignore[no-any-return]


def as_index_type(value: int, kind: type[np.integer[Any]]) -> Any:
    """``value`` as a numpy integer of type ``kind`` (a user's index type), or as
    ``np.int64`` where it does not fit ``kind`` (never wrapped around)."""
    info = np.iinfo(kind)
    return kind(value) if info.min <= value <= info.max else np.int64(value)


class MapDataset(Generic[T], grain_types.MapDataset, metaclass=_MapDatasetMeta):
    """A lazy, random-access dataset: ``len(ds)`` elements per epoch, ``ds[i]`` for any int.

    >>> import gristmill as gm
    >>> ds = gm.MapDataset.range(10).seed(42).shuffle().map(lambda x: x * 10)
    >>> [ds[i] for i in range(4)]
    [10, 70, 60, 90]
    """

    _one_to_one: ClassVar[bool] = False
    """Whether ``_get(i)`` reads exactly one element of its one parent (a source: of
    none), as ``_read`` does for each index: a one-element read that the op clock does not
    time is still counted at such a node (``op_clock.OpClock.count_untimed``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        read = cls.__dict__.get("_read")
        if read is not None and not getattr(read, "__gristmill_timed__", False):
            cls._read = timed_read(read)  # type: ignore[method-assign]  # per-op statistics

    def __init__(self, parents: MapDataset[Any] | Sequence[MapDataset[Any]] = ()) -> None:
        if isinstance(parents, MapDataset):
            parents = (parents,)
        self._parents: tuple[MapDataset[Any], ...] = tuple(parents)

    # -- graph -------------------------------------------------------------------------

    @property
    def parents(self) -> tuple[MapDataset[Any], ...]:
        """The datasets this one reads from."""
        return self._parents

    @property
    def _parent(self) -> MapDataset[Any]:
        if len(self._parents) != 1:
            raise ValueError(
                f"{type(self).__name__} has {len(self._parents)} parents; _parent is only "
                "defined for exactly one — use self.parents"
            )
        return self._parents[0]

    @property
    def _own_seed(self) -> int | None:
        """The seed this node sets for downstream random ops (only ``ds.seed()`` nodes)."""
        return None

    def _on_parents(self, parents: tuple[MapDataset[Any], ...]) -> MapDataset[T]:
        """A copy of this node reading ``parents`` instead (a worker's sliced sources).

        The copy keeps the default seed derived from the original graph. A node that
        derives fields from its parents at construction (a length, a permutation) overrides
        this to derive them again from the new parents.
        """
        self._default_seed  # noqa: B018 (derived from the original graph: the copy keeps it)
        clone = copy.copy(self)
        clone._parents = tuple(parents)
        return clone

    @functools.cached_property
    def _stats(self) -> NodeStats:
        """Grain's recorder for subclasses: ``with self._stats.record_self_time(): ...``."""
        return NodeStats()

    @functools.cached_property
    def _default_seed(self) -> int | None:
        return seeds.derive_default_seed(
            self, lambda node: node.parents, lambda node: getattr(node, "_own_seed", None)
        )

    # -- reading -----------------------------------------------------------------------

    @abc.abstractmethod
    def __len__(self) -> int:
        """The length of one epoch (``sys.maxsize`` when infinite)."""

    @overload
    def __getitem__(self, index: int) -> T | None: ...

    @overload
    def __getitem__(self, index: slice) -> MapDataset[T]: ...

    def __getitem__(self, index: int | slice) -> T | MapDataset[T] | None:
        """The element at ``index`` (``None`` where filtered out), or a slice of the dataset."""
        if type(index) is not int:
            if isinstance(index, slice):
                return self.slice(index)
            given: object = index  # typed int, often a numpy integer (e.g. from np.arange)
            if isinstance(given, np.integer):
                return self._get_typed(int(given), type(given))
            index = validation.check_index(index)
        return self._get(index)

    def _get_typed(self, index: int, kind: type[np.integer[Any]]) -> T | None:
        """The element at ``index`` read with a numpy integer of type ``kind``.

        Grain computes with the index as given, so a range, and the nodes that pass the
        index down unchanged (map, filter, slice, ...), return (or pass their function) a
        numpy integer of the index's type. Those nodes override this; every other node reads
        as with an int. Arithmetic stays on ints: only the result takes ``kind``
        (:func:`as_index_type`).
        """
        return self._get(index)

    def _get(self, index: int) -> T | None:
        # Only reached for user subclasses, which implement __getitem__ themselves.
        if type(self).__getitem__ is MapDataset.__getitem__:
            raise NotImplementedError(
                f"{type(self).__name__} must implement __getitem__(self, index) (and __len__) "
                "to subclass MapDataset"
            )
        return self[index]

    def _getitems(self, indices: Sequence[int] | npt.NDArray[Any]) -> list[T | None]:
        """Reads many elements at once (one batched read per source)."""
        return self._read(as_index_array(indices))

    @timed_read
    def _read(self, indices: IndexArray) -> list[T | None]:
        # Only reached for user subclasses; built-in nodes read chunks natively.
        getitems = type(self)._getitems
        if getitems is not MapDataset._getitems:
            return list(getitems(self, indices.tolist()))
        get = self._get
        return [get(i) for i in indices.tolist()]

    def __iter__(self) -> DatasetIterator[T]:
        return iter(self.to_iter_dataset())

    @property
    def _element_spec(self) -> Any:
        """The structure, shapes and dtypes of the elements, found without reading data."""
        raise NotImplementedError(
            f"element spec inference is not implemented for {type(self).__name__}; "
            "get_element_spec needs every node of the pipeline to support it"
        )

    def __str__(self) -> str:
        return type(self).__name__

    def _structure(self) -> str:
        """This node in a checkpoint's pipeline description (see ``core/state.py``).

        Override to list every parameter that decides which element comes where (a seed, a
        size, a length; a function by its qualified name); the default is the class's name
        and the length.
        """
        return f"{type(self).__qualname__}(len={len(self)})"

    # -- fluent API ----------------------------------------------------------------------

    def pipe(self, func: Callable[..., S], /, *args: Any, **kwargs: Any) -> S:
        """Returns ``func(self, *args, **kwargs)`` (for readable chains of custom steps)."""
        return func(self, *args, **kwargs)

    def seed(self, seed: int) -> MapDataset[T]:
        """Sets the default seed of every random op downstream (shuffle, random_map, …)."""
        return op("seed")(self, seed)  # type: ignore[no-any-return]

    def shuffle(self, seed: int | None = None) -> MapDataset[T]:
        """A new permutation of every epoch; ``seed`` in [0, 2**32) or from ``ds.seed()``."""
        return op("shuffle")(self, seed)  # type: ignore[no-any-return]

    def slice(self, sl: slice | Sequence[int] | MapDataset[int]) -> MapDataset[T]:
        """The elements at ``range(len(self))[sl]``, or at the indices ``sl`` (a sequence
        or a MapDataset of ints in ``[0, len(self))``, in its order, repeats allowed); later
        epochs read later parent epochs.

        >>> import gristmill as gm
        >>> list(gm.MapDataset.range(10, 20).slice([3, 1, 4, 1]))
        [13, 11, 14, 11]
        """
        if isinstance(sl, slice):
            return op("slice")(self, sl)  # type: ignore[no-any-return]
        return op("reindex")(self, sl)  # type: ignore[no-any-return]

    def repeat(
        self, num_epochs: int | None = None, *, reseed_each_epoch: bool = True
    ) -> MapDataset[T]:
        """``num_epochs`` epochs (forever if None); each epoch reshuffles unless told not to."""
        return op("repeat")(self, num_epochs, reseed_each_epoch)  # type: ignore[no-any-return]

    def map(self, transform: Any) -> MapDataset[Any]:
        """Applies a callable or ``transforms.Map`` to every element (``None`` passes through)."""
        return op("map")(self, transform)  # type: ignore[no-any-return]

    def random_map(self, transform: Any, *, seed: int | None = None) -> MapDataset[Any]:
        """Applies ``fn(x, rng)`` with a generator that depends only on (seed, index)."""
        return op("random_map")(self, transform, seed)  # type: ignore[no-any-return]

    def map_with_index(self, transform: Any) -> MapDataset[Any]:
        """Applies ``fn(index, x)`` where ``index`` is the position read from this dataset."""
        return op("map_with_index")(self, transform)  # type: ignore[no-any-return]

    def filter(self, transform: Any) -> MapDataset[T]:
        """Keeps elements where the predicate is true; others read as ``None``."""
        return op("filter")(self, transform)  # type: ignore[no-any-return]

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[Sequence[T]], S] | None = None,
    ) -> MapDataset[S]:
        """Groups consecutive elements of each epoch; leaves are stacked by default."""
        return op("batch")(self, batch_size, drop_remainder, batch_fn)  # type: ignore[no-any-return]

    def apply(self, transformations: Any) -> MapDataset[Any]:
        """Applies a transformation object or a sequence of them, in order."""
        return op("apply")(self, transformations)  # type: ignore[no-any-return]

    def to_iter_dataset(
        self, read_options: Any = None, *, allow_nones: bool = False
    ) -> IterDataset[T]:
        """An IterDataset that reads this dataset's epoch in order (``None`` skipped)."""
        return op("to_iter_dataset")(self, read_options, allow_nones)  # type: ignore[no-any-return]
