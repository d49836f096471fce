"""``aggregate``: a stateful ``accumulate`` / ``flush`` aggregation of an upstream stream.

Run inline by whoever pulls it; it flattens ``Expand`` values and skips ``SKIP`` ones. With
keyed items (a resumable pipeline) each output is covered by one ``tracking.Batch`` key:
what it consumed, in order (``tracking.Covers``). A restored state's open batches are
formed again first from exactly their members (``rebuild.BatchRebuilds``: the stream's
items of theirs are claimed before the aggregator sees them). At an ``EPOCH_END`` the
partial aggregate is flushed (or dropped with ``drop_last``) and the marker forwarded; an
error from upstream ends the stream after a flush, as upstream's EOF after a failure does.
"""

from __future__ import annotations

import copy
import itertools
import operator
import time
from collections.abc import Sequence
from typing import Any, Protocol

from gristmill._src.engine.feeds import Chunk, ChunkStream
from gristmill._src.engine.markers import EPOCH_END, SKIP, flatten
from gristmill._src.engine.stats import StageCounters
from gristmill._src.spdl.defs import Collate
from gristmill._src.spdl.hooks import StageHooks
from gristmill._src.spdl.rebuild import BatchRebuilds
from gristmill._src.spdl.tracking import Batch, Covers, DeliveredOutputs, Keyed


def covers_take(covers: Covers, output: Any) -> Any:
    """``output`` keyed with what was consumed, if the stream is keyed."""
    if covers:
        return covers.take(output)
    return output


class Aggregator(Protocol):
    def accumulate(self, item: Any) -> Any: ...

    def flush(self) -> Any: ...


class AggregateStream:
    """``aggregator`` over ``upstream``'s items; a flush at the end (unless ``drop_last``).

    An error from upstream ends the stream: the partial aggregate is flushed first (as
    upstream's EOF after a failure does), then the error follows.
    """

    def __init__(
        self,
        upstream: ChunkStream,
        aggregator: Aggregator,
        *,
        drop_last: bool,
        name: str,
        epochs: bool = False,
        hooks: StageHooks | None = None,
        delivered: DeliveredOutputs | None = None,
    ) -> None:
        self._upstream = upstream
        self._unused = aggregator  # copied for the batches a restore forms again
        self._delivered = delivered
        self._rebuilds: BatchRebuilds | None = None
        # with drop_last, a partial batch of a Collate is dropped here (no flush call)
        self._collate = aggregator if type(aggregator) is Collate else None
        if hooks is not None:  # each call runs inside the stage's task hooks, as in SPDL
            aggregator = _Hooked(aggregator, hooks)
        # The stream may carry EPOCH_END (a continuous source): cut keyed chunks there too.
        self._markers = (SKIP, EPOCH_END) if epochs else (SKIP,)
        self._aggregator = aggregator
        self._drop_last = drop_last
        self._done = False
        self._position = 0
        self._counters = StageCounters(name, 1, 1)
        self._covers = Covers()  # source keys consumed since the last output

    def _flush(self, outputs: list[Any]) -> None:
        """The partial aggregate at an end: ``flush()``'s, or none with ``drop_last``
        (SPDL does not call ``flush`` then)."""
        last = None
        if not self._drop_last:
            last = self._aggregator.flush()
        elif self._collate is not None:
            self._collate._items = []
        if last is not None:
            outputs.append(covers_take(self._covers, last))
        else:
            dropped = self._covers.drop_all()
            if dropped is not None:
                outputs.append(dropped)

    def _start_rebuilds(self) -> None:
        """Before the first item: the batches a restored state names, to form again."""
        delivered, self._delivered = self._delivered, None
        if delivered is not None and delivered.members:
            self._rebuilds = BatchRebuilds(delivered.members, copy.deepcopy(self._unused))

    def _claim(self, chunk: Chunk, outputs: list[Any]) -> Chunk:
        """``chunk`` less the items of the batches to form again (formed into ``outputs``
        once whole)."""
        rebuilds = self._rebuilds
        assert rebuilds is not None
        if chunk.keys is not None:
            values, keys = [], []
            for value, key in zip(chunk.values, chunk.keys, strict=True):
                if key is None or not rebuilds.claim(key, value, outputs):
                    values.append(value)
                    keys.append(key)
            return Chunk(chunk.start, values, chunk.error, keys)
        kept = []
        for item in flatten(chunk.values):
            claimed = isinstance(item, Keyed) and len(item.cover) == 1
            if claimed and rebuilds.claim(item.cover[0], item.value, outputs):
                continue
            kept.append(item)
        return Chunk(chunk.start, kept, chunk.error)

    def next_chunk(self) -> Chunk | None:
        if self._done:
            return None
        if self._delivered is not None:
            self._start_rebuilds()
        accumulate = self._aggregator.accumulate
        collate = self._aggregator if type(self._aggregator) is Collate else None
        covers = self._covers
        while True:
            taking = time.perf_counter()
            chunk = self._upstream.next_chunk()
            began = time.perf_counter()
            self._counters.input_wait_s += began - taking  # its input (upstream work too)
            outputs: list[Any] = []
            error = None
            if chunk is not None and self._rebuilds:
                chunk = self._claim(chunk, outputs)
            if chunk is not None and chunk.keys is not None and collate is not None:
                self._collate_keyed(collate, chunk.values, chunk.keys, outputs)
            elif chunk is not None and chunk.keys is not None:
                # Plain values keyed by chunk (one source position each; see tracking).
                for value, key in zip(chunk.values, chunk.keys, strict=True):
                    if value is EPOCH_END:  # flush the partial aggregate, then the boundary
                        self._flush(outputs)
                        outputs.append(EPOCH_END)
                        continue
                    if value is SKIP:  # dropped upstream: resolves with the next output
                        covers.dropped.append(key)
                        continue
                    covers.keys.append(key)
                    out = accumulate(value)
                    if out is not None:
                        outputs.append(covers.take(out))
            elif chunk is not None:
                for item in flatten(chunk.values):
                    if item is EPOCH_END:  # flush the partial aggregate, then the boundary
                        self._flush(outputs)
                        outputs.append(EPOCH_END)
                        continue
                    if type(item) is Keyed and collate is not None:  # lists of n, inlined
                        value = item.value
                        if value is SKIP:
                            covers.dropped.extend(item.cover)
                            continue
                        covers.members.append(item.cover)
                        batch = collate._items
                        batch.append(value)
                        if len(batch) >= collate.n:
                            collate._items = []
                            outputs.append(covers.take(batch))
                        continue
                    if isinstance(item, Keyed):
                        value = item.value
                        if value is SKIP:  # dropped upstream: resolves with the next
                            covers.dropped.extend(item.cover)
                            continue
                        covers.members.append(item.cover)
                        out = accumulate(value)
                        if out is not None:
                            outputs.append(covers.take(out))
                        continue
                    out = accumulate(item)
                    if out is not None:
                        outputs.append(out)
            if chunk is not None:
                self._counters.task_done(len(chunk.values), time.perf_counter() - began)
                error = chunk.error
            if chunk is None or error is not None:
                self._done = True
                if self._rebuilds:
                    self._rebuilds.form_rest(outputs)
                self._flush(outputs)
            if outputs or error is not None:
                start, self._position = self._position, self._position + len(outputs)
                self._counters.delivered(len(outputs), 0)
                return Chunk(start, outputs, error)
            if self._done:
                return None

    def _collate_keyed(
        self, collate: Collate, values: list[Any], keys: Sequence[Any], outputs: list[Any]
    ) -> None:
        """Lists of ``collate.n`` of chunk-keyed plain values, cut by slicing.

        Runs of values without a dropped item (``SKIP``) are cut in bulk; a dropped item's
        key resolves with the next output, as in the general path.
        """
        covers = self._covers
        n = collate.n
        i, end = 0, len(values)
        while i < end:
            # The next dropped item or epoch end, or the end: found in C (identity only).
            rest = values[i:]
            stop = min(
                next(
                    itertools.compress(
                        itertools.count(i), map(operator.is_, rest, itertools.repeat(marker))
                    ),
                    end,
                )
                for marker in self._markers
            )
            while i < stop:
                batch = collate._items
                if not batch and not covers and stop - i >= n and type(keys) is range:
                    # A whole batch of consecutive positions: its cover is a range (the
                    # caller resolves it in O(1)), its members implicit.
                    cover = keys[i : i + n]
                    outputs.append(Keyed(values[i : i + n], (Batch(cover, cover[0]),)))
                    i += n
                    continue
                take = min(n - len(batch), stop - i)
                batch.extend(values[i : i + take])
                covers.keys.extend(keys[i : i + take])
                i += take
                if len(batch) >= n:
                    collate._items = []
                    outputs.append(covers.take(batch))
            if i < end and values[i] is EPOCH_END:  # flush the partial batch, then the marker
                self._flush(outputs)
                outputs.append(EPOCH_END)
                i += 1
            elif i < end:  # values[i] is SKIP
                covers.dropped.append(keys[i])
                i += 1

    def reset(self, position: int) -> None:
        raise ValueError("an aggregation cannot be repositioned")

    def close(self) -> None:
        self._upstream.close()

    def statistics(self) -> Any:
        return self._counters.snapshot()


class _Hooked:
    """An aggregator whose ``accumulate`` and ``flush`` calls run inside a stage's task
    hooks (``build(task_hook_factory=...)``)."""

    def __init__(self, inner: Aggregator, hooks: StageHooks) -> None:
        self._inner = inner
        self._hooks = hooks

    def accumulate(self, item: Any) -> Any:
        return self._hooks.call_sync(self._inner.accumulate, item)

    def flush(self) -> Any:
        return self._hooks.call_sync(lambda _: self._inner.flush(), None)
