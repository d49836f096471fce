"""Which records a DataLoader state says were consumed, and where a restore continues.

Grain's DataLoader state (version 2) records, for each of ``W`` workers (``W = 1`` without
workers), the global sampler index of the last record that worker read:
``last_seen_indices[str(w)]``. Worker ``w`` of shard ``s`` of ``C`` reads the shard's local
positions ``w, w + W, w + 2W, …`` (local position ``i`` is sampler index ``i*C + s``), so the
state says that worker ``w`` consumed its first ``taken[w]`` positions, where
``last_seen = s - W*C + w*C + taken[w]*W*C``.

gristmill reads the records in local order for every worker count, so the records consumed
by one of its iterators are always a *prefix*, the first ``n`` positions: ``taken[w] =
ceil((n - w) / W)``, and ``n = sum(taken)``. A restore under any worker count continues at
position ``n``: exactly the records not yet consumed, each once, in the order an
uninterrupted run (with any worker count) has them; with equal counts the state and the
continuation are Grain's. A Grain state whose workers consumed unevenly (each Grain worker
batches and filters its own records, google/grain#953) is not a prefix: it is refused, as
no position continues it without repeating or losing records — unless the caller asked for
``validate_state=False``, which continues at the first record not consumed (records
consumed after it are read again; none is lost). Such a state continues exactly in Grain's
own order: ``DataLoader(..., order=MultiprocessingOrder.GRAIN_PER_WORKER)`` under the same
worker count (the functions at the end of this module).
"""

from __future__ import annotations

import operator
from typing import Any

_FIX = "pass the bytes returned by DataLoaderIterator.get_state()"


def records_taken(data: dict[str, Any], shard_index: int, shard_count: int) -> list[int]:
    """``taken[w]``: how many positions of worker ``w``'s slice the state consumed.

    Raises:
      ValueError: a field is missing, of the wrong type or not a position of this shard.
    """
    if data["version"] != 2:
        raise ValueError(
            f"DataLoader state 'version' must be 2 (Grain 0.2.18's format), got "
            f"{data['version']!r}; {_FIX}"
        )
    worker_count = _integer(data["worker_count"], "worker_count", low=0)
    workers = max(worker_count, 1)
    last_seen = data["last_seen_indices"]
    # named one by one up to 64 workers: a huge worker_count must not build a huge list
    expected: Any = [str(w) for w in range(workers)] if workers <= 64 else f"0..{workers - 1}"
    if not isinstance(last_seen, dict) or not _names_workers(last_seen, workers):
        raise ValueError(
            f"DataLoader state 'last_seen_indices' must map each worker {expected} (the "
            f"state's worker_count is {worker_count}) to a sampler index, got {last_seen!r:.200}; "
            f"{_FIX}"
        )
    last_worker = _integer(data["last_worker_index"], "last_worker_index", low=-1)
    if last_worker >= workers:
        raise ValueError(
            f"DataLoader state 'last_worker_index' must be in [-1, {workers - 1}] for "
            f"worker_count {worker_count}, got {last_worker}; {_FIX}"
        )
    stride = workers * shard_count
    taken = []
    for w in range(workers):
        last = _integer(last_seen[str(w)], f"last_seen_indices['{w}']")
        first = shard_index + w * shard_count  # worker w's first record
        if last < first - stride or (last - first) % stride:
            raise ValueError(
                f"DataLoader state 'last_seen_indices['{w}']' = {last} is not a record of "
                f"worker {w} of shard {shard_index} of {shard_count} with {workers} worker(s) "
                f"(expected {first - stride} or {first} + a multiple of {stride}); restore "
                "the state under the shard options that saved it"
            )
        taken.append((last - first) // stride + 1)
    return taken


def continuation(taken: list[int], *, exact: bool) -> int:
    """The local position a restore continues at (see the module docstring).

    Raises:
      ValueError: ``exact`` and the consumed records are not a prefix.
    """
    workers = len(taken)
    consumed = sum(taken)
    if taken == [-(-(consumed - w) // workers) if consumed > w else 0 for w in range(workers)]:
        return consumed
    first_open = min(w + t * workers for w, t in enumerate(taken))
    if exact:
        raise ValueError(
            f"this DataLoader state's {workers} workers consumed unevenly (records per "
            f"worker: {taken}), as Grain's workers do when they batch or filter their own "
            "records (google/grain#953): in this loader's order (the merged record stream, "
            "MultiprocessingOrder.PIPELINE) no position continues it without repeating or "
            f"losing records. Restore it under DataLoader(..., worker_count={workers}, "
            "order=MultiprocessingOrder.GRAIN_PER_WORKER), which reproduces Grain's "
            "per-worker order and continues it exactly; or, in this order, with "
            "DataLoaderIterator(loader, json.loads(state), validate_state=False) to continue "
            f"at record {first_open} of the shard (the first not consumed; records consumed "
            "after it are read again)"
        )
    return first_open


def _names_workers(last_seen: dict[Any, Any], workers: int) -> bool:
    """Whether the keys are exactly "0", "1", …, str(workers - 1)."""
    return len(last_seen) == workers and all(
        isinstance(k, str) and k.isdigit() and str(int(k)) == k and int(k) < workers
        for k in last_seen
    )


def _integer(value: Any, name: str, *, low: int | None = None) -> int:
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None or (low is not None and number < low):
        bound = "" if low is None else f" >= {low}"
        raise ValueError(
            f"DataLoader state {name!r} must be an integer{bound}, got {value!r}; {_FIX}"
        )
    return number


def innermost_next_index(state: Any) -> int:
    """The record position (``next_index``) at the bottom of a pipeline's state."""
    node = state
    while isinstance(node, dict):
        if "next_index" in node:
            return int(node["next_index"])
        node = node.get("parent")
    raise ValueError(f"the loader's iterator state has no record position: {state!r:.200}")


def with_next_index(state: Any, next_index: int) -> Any:
    """``state`` with its record position (``next_index``, at the bottom) replaced."""
    if not isinstance(state, dict):
        return state
    if "next_index" in state:
        return {**state, "next_index": next_index}
    if "parent" in state:
        return {**state, "parent": with_next_index(state["parent"], next_index)}
    return state


# -- Grain's per-worker order (DataLoader(order=MultiprocessingOrder.GRAIN_PER_WORKER)) ------


def per_worker_fields(
    interleave: dict[str, Any], shard_index: int, shard_count: int
) -> dict[str, Any]:
    """``last_seen_indices`` and ``last_worker_index`` of the per-worker interleave's state.

    Slot ``w`` of the interleave is worker ``w``'s pipeline; its record position ``next_w``
    (records read from its slice, filtered ones included) is ``taken[w]`` of the module
    docstring, so ``last_seen = s - W*C + w*C + next_w*W*C``; the worker due next is the
    interleave's ``next_index_in_cycle``.
    """
    workers = interleave["iterators_in_use_states"]
    stride = len(workers) * shard_count
    last_seen = {
        str(w): shard_index - stride + w * shard_count + innermost_next_index(state) * stride
        for w, state in enumerate(workers)
    }
    return {
        "last_seen_indices": last_seen,
        "last_worker_index": int(interleave["next_index_in_cycle"]) - 1,
    }


def per_worker_interleave(
    data: dict[str, Any], taken: list[int], current: dict[str, Any]
) -> dict[str, Any]:
    """The per-worker interleave's state that continues ``data`` as Grain does: every
    worker restarts at its ``taken[w]`` (none exhausted: a worker whose slice is done finds
    nothing and is skipped), the round robin at ``last_worker_index + 1``. ``current`` (the
    interleave's state now) gives the shape of each worker's state."""
    workers = len(taken)
    shapes = current["iterators_in_use_states"]
    return {
        "next_index_in_cycle": (int(data["last_worker_index"]) + 1) % workers,
        "next_index_in_datasets": workers,
        "iterators_in_use_indices": list(range(workers)),
        "iterators_in_use_states": [
            with_next_index(shape, t) for shape, t in zip(shapes, taken, strict=True)
        ],
        "exhausted": [0] * workers,
    }
