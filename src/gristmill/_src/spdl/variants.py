"""``path_variants``: items routed to one of several stage chains, outputs merged.

A *dispatcher* thread pulls the upstream stream, asks the router for each item's path and
queues it at that path's inlet (a chunk stream the path's first stage pulls). Inlets share
a bound on the items they hold (the look-ahead): a slow path holds at most that many, and
meanwhile the dispatcher keeps feeding the other paths. One *puller* thread per path drains
its last stage into the merged output, so outputs arrive in completion order across paths
and in order within each. An ``EPOCH_END`` (continuous source) is sent down every path and
passed on once every path delivered it; nothing of the next epoch overtakes it.

With ``batched=True`` every item is a list: the router returns one path per element, every
path gets one (possibly empty) sub-list per input list, and the paths' outputs for the same
input are concatenated in path order.

A router failure (or an index out of range) ends the stage: the error follows the outputs
of what was routed before it. Keyed items (a resumable pipeline) keep their covers through
the paths; a dropped one (``Keyed(SKIP, ...)``) bypasses them.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from typing import Any

from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, SKIP, flatten
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.stage_spec import OpKind, function_kind
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl.merged import MergedOutput
from gristmill._src.spdl.tracking import Keyed

LOOKAHEAD = 64
"""Items routed but not yet taken by their paths, at most (all paths together)."""
_JOIN_TIMEOUT_S = 1.0


class _Gate:
    """The shared look-ahead bound of all inlets, and the stage's closed flag."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.closed = False
        self.cond = threading.Condition()


class _Inlet:
    """A path's source: the items routed to it, in order (a chunk stream)."""

    def __init__(self, gate: _Gate) -> None:
        self._gate = gate
        self._items: collections.deque[Any] = collections.deque()
        self._ended = False
        self._position = 0

    def put(self, item: Any) -> None:
        """Queues ``item``; waits while the inlets hold ``capacity`` items (not on markers)."""
        gate = self._gate
        with gate.cond:
            if item is not EPOCH_END:
                while gate.held >= gate.capacity and not gate.closed:
                    gate.cond.wait()
                gate.held += 1
            self._items.append(item)
            gate.cond.notify_all()

    def end(self) -> None:
        with self._gate.cond:
            self._ended = True
            self._gate.cond.notify_all()

    def next_chunk(self) -> Chunk | None:
        gate = self._gate
        with gate.cond:
            while not self._items and not self._ended and not gate.closed:
                gate.cond.wait()
            if gate.closed:
                raise RunnerClosedError("the path variants stage is closed")
            if not self._items:
                return None
            values = list(self._items)
            self._items.clear()
            gate.held -= sum(1 for v in values if v is not EPOCH_END)
            gate.cond.notify_all()
        start, self._position = self._position, self._position + len(values)
        return Chunk(start, values)

    def reset(self, position: int) -> None:
        raise ValueError("a path of path_variants cannot be repositioned")

    def close(self) -> None:
        with self._gate.cond:
            self._gate.closed = True
            self._gate.cond.notify_all()


class _Router:
    """``router`` as a plain call (an async router runs on a private event loop)."""

    def __init__(self, router: Callable[[Any], Any]) -> None:
        self._router = router
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_async = function_kind(router) is OpKind.ASYNC

    def __call__(self, value: Any) -> Any:
        if not self._is_async:
            return self._router(value)
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self._router(value))

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


class PathVariantsStream:
    """The merged outputs of ``paths`` (each built by ``build_path(inlet)``) for the items
    ``router`` sends them."""

    def __init__(
        self,
        upstream: ChunkStream,
        router: Callable[[Any], Any],
        build_path: Callable[[int, ChunkStream], ChunkStream],
        num_paths: int,
        *,
        batched: bool,
        name: str,
    ) -> None:
        self._upstream = upstream
        self._router = _Router(router)
        self._batched = batched
        self._name = name
        self._gate = _Gate(LOOKAHEAD)
        self._inlets = [_Inlet(self._gate) for _ in range(num_paths)]
        self._outlets = [build_path(i, inlet) for i, inlet in enumerate(self._inlets)]
        self._counters = StageCounters(name, num_paths, LOOKAHEAD)
        self._output = MergedOutput(name, self._counters)
        self._cond = self._output.cond
        self._merged = self._output.items  # outputs, in arrival order
        self._pending: list[collections.deque[Any]] = [collections.deque() for _ in self._outlets]
        self._paths_done = 0
        self._dispatch_error: BaseException | None = None
        self._dispatch_done = False
        self._path_error: BaseException | None = None
        self._epoch_arrivals = 0
        self._epoch_generation = 0
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._closed = False

    # -- threads ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._start_lock:
            if self._threads or self._closed:
                return
            self._threads = [
                threading.Thread(
                    target=self._dispatch, name=f"gristmill[{self._name}]-dispatch", daemon=True
                ),
                *(
                    threading.Thread(
                        target=self._pull,
                        args=(i,),
                        name=f"gristmill[{self._name}]-path{i}",
                        daemon=True,
                    )
                    for i in range(len(self._outlets))
                ),
            ]
            for thread in self._threads:
                thread.start()

    def _dispatch(self) -> None:
        try:
            while True:
                chunk = self._upstream.next_chunk()
                if chunk is None:
                    break
                for item in flatten(chunk.values):
                    self._route(item)
                if chunk.error is not None:
                    self._dispatch_error = chunk.error
                    break
        except RunnerClosedError:
            pass
        except Exception as error:  # the router failed: the stage ends with its error
            if not hasattr(error, "_gristmill_stage"):
                error._gristmill_stage = self._name  # type: ignore[attr-defined]
            self._dispatch_error = error
        finally:
            for inlet in self._inlets:
                inlet.end()
            self._router.close()
            with self._cond:
                self._dispatch_done = True
                self._cond.notify_all()

    def _route(self, item: Any) -> None:
        if item is EPOCH_END:
            for inlet in self._inlets:
                inlet.put(EPOCH_END)
            return
        keyed = isinstance(item, Keyed)
        value = item.value if keyed else item
        if value is SKIP:  # dropped upstream: nothing to route; its keys resolve at once
            self._emit([item])
            return
        if self._batched:
            self._route_batch(item, value, keyed)
            return
        self._inlets[self._index(self._router(value))].put(item)

    def _index(self, index: Any) -> int:
        count = len(self._inlets)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise IndexError(
                f"Router returned index {index}, but there are only {count} paths "
                f"(valid range: [0, {count}))."
            )
        return index

    def _route_batch(self, item: Any, batch: Any, keyed: bool) -> None:
        indices = list(self._router(batch))
        elements = list(batch)
        if len(indices) != len(elements):
            raise ValueError(
                f"Batched router returned {len(indices)} indices for a batch of "
                f"{len(elements)} items; it must return exactly one index per item."
            )
        parts: list[list[Any]] = [[] for _ in self._inlets]
        for element, index in zip(elements, indices, strict=True):
            parts[self._index(index)].append(element)
        for path, inlet in enumerate(self._inlets):
            if not keyed:
                inlet.put(parts[path])
            else:  # path 0's part covers the batch (its keys resolve once all is delivered)
                inlet.put(Keyed(parts[path], item.cover if path == 0 else ()))

    def _pull(self, path: int) -> None:
        outlet = self._outlets[path]
        try:
            while True:
                chunk = outlet.next_chunk()
                if chunk is None:
                    break
                values = list(flatten(chunk.values))
                if self._batched:
                    self._arrive_batched(path, values)
                else:
                    self._arrive(values)
                if chunk.error is not None:
                    with self._cond:
                        if self._path_error is None:
                            self._path_error = chunk.error
                        self._cond.notify_all()
                    break
        except RunnerClosedError:
            pass
        except Exception as error:  # a path stage raised out of its stream
            with self._cond:
                if self._path_error is None:
                    self._path_error = error
                self._cond.notify_all()
        finally:
            with self._cond:
                self._paths_done += 1
                self._cond.notify_all()

    def _arrive(self, values: list[Any]) -> None:
        """A path's outputs, in order; an EPOCH_END waits for every path's."""
        start = 0
        for i, value in enumerate(values):
            if value is EPOCH_END:
                self._emit(values[start:i])
                self._barrier()
                start = i + 1
        self._emit(values[start:])

    def _barrier(self) -> None:
        with self._cond:
            generation = self._epoch_generation
            self._epoch_arrivals += 1
            if self._epoch_arrivals == len(self._outlets):
                self._epoch_arrivals = 0
                self._epoch_generation += 1
                self._merged.append(EPOCH_END)
                self._cond.notify_all()
                return
            while self._epoch_generation == generation and not self._closed:
                self._cond.wait()

    def _arrive_batched(self, path: int, values: list[Any]) -> None:
        """One output per input batch and path; complete rows are concatenated."""
        with self._cond:
            self._pending[path].extend(values)
            while all(self._pending):
                row = [pending.popleft() for pending in self._pending]
                self._merged.append(EPOCH_END if row[0] is EPOCH_END else _concatenated(row))
            self._cond.notify_all()

    def _emit(self, values: list[Any]) -> None:
        if values:
            with self._cond:
                self._merged.extend(values)
                self._cond.notify_all()

    # -- the stream ---------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        self.start()
        return self._output.next_chunk(self._outcome)

    def _outcome(self) -> tuple[bool, BaseException | None]:
        """A path's error at once; the router's once every path drained. ``_cond`` held."""
        error = self._path_error
        finished = self._paths_done == len(self._outlets)
        if error is None and finished:
            error = self._dispatch_error
        if error is not None:
            self._path_error = self._dispatch_error = None
            self._paths_done = len(self._outlets)
        return finished, error

    def reset(self, position: int) -> None:
        raise ValueError("a path_variants stage cannot be repositioned")

    def close(self) -> None:
        with self._cond:
            self._closed = True
        self._output.close()
        self._inlets[0].close()  # closes the shared gate: wakes the dispatcher and paths
        self._upstream.close()
        for outlet in self._outlets:
            outlet.close()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)

    def statistics(self) -> Any:
        return self._counters.snapshot()


def _concatenated(row: list[Any]) -> Any:
    """One input batch's outputs of every path, concatenated in path order."""
    keyed = any(isinstance(output, Keyed) for output in row)
    if not keyed:
        return [element for output in row if output is not SKIP for element in output]
    values: list[Any] = []
    cover: list[Any] = []
    for output in row:
        cover.extend(output.cover)
        if output.value is not SKIP:
            values.extend(output.value)
    if not values and all(output.value is SKIP for output in row):
        return Keyed(SKIP, tuple(cover))
    return Keyed(values, tuple(cover))
