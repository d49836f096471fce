"""``defs.Merge``: several pipelines' outputs as one pipeline's source.

Each input pipeline is built as its own :class:`Pipeline` and read by a *puller* thread.
By default outputs are forwarded in arrival order; at an epoch end (continuous inputs) a
puller waits until every input reached its epoch end, then one ``EPOCH_END`` passes on,
so epochs never mix. An input that ends simply stops contributing.

A custom ``op(info, input_queues, output_queue)`` runs on an event loop of its own: each
input queue is an ``asyncio.Queue`` the puller fills (bounded: a puller waits while its
queue holds ``INPUT_BUFFER`` items: :class:`_Room`, which ``close`` wakes), ending with
``EOF`` (``is_eof``); what the op puts on ``output_queue`` is the merged stream. When the op
returns, the inputs are stopped (an early return is fine); when it raises, the stage fails
with its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from gristmill._src.engine.feeds import Chunk
from gristmill._src.engine.markers import EOF, EPOCH_END
from gristmill._src.engine.ordered import RunnerClosedError
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl.merged import MergedOutput

INPUT_BUFFER = 8
_JOIN_TIMEOUT_S = 1.0


class _Room:
    """The room left in one input queue of a custom merge: its puller takes one place per
    item, the op's loop gives it back per item it gets; :meth:`close` wakes the puller."""

    def __init__(self, places: int) -> None:
        self._places = places
        self._closed = False
        self._changed = threading.Condition(threading.Lock())

    def take(self) -> bool:
        """Waits for a place and takes it; False once closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._places > 0 or self._closed)
            if self._closed:
                return False
            self._places -= 1
            return True

    def give(self) -> None:
        with self._changed:
            self._places += 1
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class _InputQueue(asyncio.Queue[Any]):
    """An input of a custom merge: filled from a puller thread, ``room`` bounds it."""

    def __init__(self, room: _Room) -> None:
        super().__init__()
        self._room = room

    async def get(self) -> Any:
        item = await super().get()
        self._room.give()
        return item

    def get_nowait(self) -> Any:
        item = super().get_nowait()
        self._room.give()
        return item


class _OutputQueue(asyncio.Queue[Any]):
    """A custom merge's output: every item put goes straight to the merged stream."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        super().__init__()
        self._emit = emit

    async def put(self, item: Any) -> None:
        self._emit(item)

    def put_nowait(self, item: Any) -> None:
        self._emit(item)


class MergeStream:
    """The outputs of the pipelines of ``config`` (a ``MergeConfig``), as one stream."""

    def __init__(self, config: Any, build: Callable[[Any], Any], info: Any) -> None:
        self._config = config
        self._build = build
        self._info = info
        self._name = str(info)
        self._counters = StageCounters(self._name, len(config.pipeline_configs), 1)
        self._output = MergedOutput(self._name, self._counters)
        self._cond = self._output.cond
        self._merged = self._output.items
        self._pipelines: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._inputs_done = 0
        self._op_done = False
        self._error: BaseException | None = None
        self._arrivals = 0
        self._generation = 0
        self._closed = False
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # a custom merge's input queues' room (made here: `close` may run before `start`)
        self._rooms = (
            [_Room(INPUT_BUFFER) for _ in config.pipeline_configs] if config.op is not None else []
        )
        self._start_lock = threading.Lock()

    # -- threads ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._start_lock:
            if self._started or self._closed:
                return
            self._started = True
            self._pipelines = [self._build(sub) for sub in self._config.pipeline_configs]
            custom = self._config.op is not None
            targets: list[tuple[Callable[..., None], tuple[Any, ...], str]] = []
            if custom:
                self._loop = asyncio.new_event_loop()
                queues = self._make_queues(self._rooms)
                targets.append((self._run_op, (queues,), "op"))
                for i in range(len(self._pipelines)):
                    targets.append((self._feed, (i, queues[i], self._rooms[i]), f"input{i}"))
            else:
                for i in range(len(self._pipelines)):
                    targets.append((self._pull, (i,), f"input{i}"))
            for target, args, suffix in targets:
                thread = threading.Thread(
                    target=target, args=args, name=f"gristmill[{self._name}]-{suffix}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _make_queues(self, rooms: list[_Room]) -> list[_InputQueue]:
        loop = self._loop
        assert loop is not None

        async def make() -> list[_InputQueue]:  # queues belong to the loop that runs the op
            return [_InputQueue(room) for room in rooms]

        return loop.run_until_complete(make())

    def _pull(self, index: int) -> None:
        """Default merge: forward one input's items; epoch ends wait for every input."""
        pipeline = self._pipelines[index]
        try:
            while not self._closed:
                item = pipeline.next_item_or_marker()
                if item is EOF:
                    break
                if item is EPOCH_END:
                    self._barrier()
                    continue
                self._emit(item)
        except RunnerClosedError:
            pass
        except Exception as error:
            self._fail(error)
        finally:
            with self._cond:
                self._inputs_done += 1
                if self._arrivals and self._arrivals >= len(self._pipelines) - self._inputs_done:
                    self._release_epoch()  # an input ended: the others need not wait for it
                self._cond.notify_all()

    def _barrier(self) -> None:
        with self._cond:
            generation = self._generation
            self._arrivals += 1
            if self._arrivals >= len(self._pipelines) - self._inputs_done:
                self._release_epoch()
                return
            while self._generation == generation and not self._closed:
                self._cond.wait()

    def _release_epoch(self) -> None:
        """Passes one EPOCH_END on. Call with ``_cond`` held."""
        self._arrivals = 0
        self._generation += 1
        self._merged.append(EPOCH_END)
        self._cond.notify_all()

    def _feed(self, index: int, queue: _InputQueue, room: _Room) -> None:
        """Custom merge: one input's items into its queue on the op's loop, then EOF."""
        loop = self._loop
        assert loop is not None
        pipeline = self._pipelines[index]
        try:
            while not self._closed:
                item = pipeline.next_item_or_marker()
                if not room.take():  # closed
                    return
                loop.call_soon_threadsafe(queue.put_nowait, item)
                if item is EOF:
                    return
        except (RunnerClosedError, RuntimeError):  # stopped, or the loop closed under us
            pass
        except Exception as error:
            self._fail(error)

    def _run_op(self, queues: list[_InputQueue]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            output = loop.run_until_complete(self._make_output())
            loop.run_until_complete(self._config.op(self._info, queues, output))
        except asyncio.CancelledError:  # closed: `close` cancelled the op
            pass
        except Exception as error:
            if not self._closed:
                self._fail(error)
        finally:
            with self._cond:
                self._op_done = True
                self._cond.notify_all()
            for pipeline in self._pipelines:  # the op is done: stop the inputs
                with contextlib.suppress(Exception):
                    pipeline.stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _make_output(self) -> _OutputQueue:
        return _OutputQueue(self._emit)

    def _emit(self, item: Any) -> None:
        with self._cond:
            self._merged.append(item)
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup) and error.exceptions:
            # An input pipeline failed: its own failure names its stage already.
            inner: Any = error.exceptions[0]
            inner._gristmill_stage = None
            error = inner
        if not hasattr(error, "_gristmill_stage"):
            error._gristmill_stage = self._name  # type: ignore[attr-defined]
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _finished(self) -> bool:
        if self._config.op is not None:
            return self._op_done
        return self._inputs_done == len(self._pipelines)

    # -- the stream ---------------------------------------------------------------------

    def next_chunk(self) -> Chunk | None:
        self.start()
        return self._output.next_chunk(self._outcome)

    def _outcome(self) -> tuple[bool, BaseException | None]:
        """The first error, else whether every input (or the op) is done. ``_cond`` held."""
        error, self._error = self._error, None
        if error is not None:
            self._op_done = True
            self._inputs_done = len(self._pipelines)
        return self._finished(), error

    def reset(self, position: int) -> None:
        raise ValueError("a merged source cannot be repositioned")

    def close(self) -> None:
        with self._cond:
            self._closed = True
        for room in self._rooms:  # a puller waiting for room
            room.close()
        self._output.close()
        for pipeline in self._pipelines:
            with contextlib.suppress(Exception):
                pipeline.stop()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_cancel_all, loop)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.ident is not None:
                thread.join(_JOIN_TIMEOUT_S)

    def statistics(self) -> Any:
        return self._counters.snapshot()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
