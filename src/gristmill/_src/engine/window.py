"""ReorderWindow: the bookkeeping of one stage's tasks in flight, with no thread and no lock.

A stage numbers the tasks it hands out (sequence numbers, from 0 after every reset), counts
the positions they hold against its bound, keeps the results that came back early, and says
which one the consumer may take next: in input order, or in completion order around
barriers (an epoch end goes when everything claimed before it has gone, and nothing claimed
after it goes before it). A failure is a result like any other (a ``Chunk`` whose ``error``
is set): the window delivers it in its place.

Whoever runs the tasks (worker threads, an event loop, worker processes, Ray actors) calls
the window under its own lock and does its own waiting; the window only answers. A reset
starts a new *generation*: results filed for an earlier one are dropped, so a task still
running when the consumer repositions the stage cannot reach the new reader.
"""

from __future__ import annotations

from gristmill._src.engine.feeds import Chunk, Task

__all__ = ["ReorderWindow"]


class ReorderWindow:
    """Sequence numbers, positions in flight and results waiting for the consumer.

    Args:
        in_order: deliver in sequence order (True) or in completion order (False).
    """

    def __init__(self, *, in_order: bool) -> None:
        self.in_order = in_order
        self.generation = 0
        self.done: dict[int, tuple[Task, Chunk]] = {}  # seq -> result, in completion order
        self.ready = 0  # positions in `done`: computed, waiting for the consumer
        self.next_claim = 0  # sequence number of the next task to claim
        self.next_seq = 0  # sequence number of the next task to deliver (input order)
        self.in_flight = 0  # positions claimed and not yet delivered
        self.tasks_out = 0  # tasks claimed and not yet delivered
        self.outstanding: set[int] = set()  # their sequence numbers
        self.barriers: set[int] = set()  # the outstanding ones that are barriers

    def reset(self) -> None:
        """Forgets every task: the next claim is sequence number 0 of a new generation."""
        self.generation += 1
        self.done.clear()
        self.ready = self.next_claim = self.next_seq = self.in_flight = self.tasks_out = 0
        self.outstanding.clear()
        self.barriers.clear()

    def clear_results(self) -> None:
        """Drops the results waiting (a closed stage delivers nothing more)."""
        self.done.clear()

    # -- the executor's side ----------------------------------------------------------------

    def reserve(self, positions: int) -> tuple[int, int]:
        """Numbers the next task and holds ``positions`` for it while its input is taken;
        returns ``(generation, sequence number)``."""
        seq = self.next_claim
        self.next_claim += 1
        self.in_flight += positions
        self.tasks_out += 1
        return self.generation, seq

    def release(self, positions: int) -> None:
        """Gives back the last reservation: its feed had nothing more."""
        self.in_flight -= positions
        self.tasks_out -= 1
        self.next_claim -= 1

    def claimed(self, seq: int, reserved: int, task: Task) -> None:
        """The reserved task ``seq`` holds ``task`` (``task.size`` positions, not
        ``reserved``)."""
        self.in_flight += task.size - reserved
        self.outstanding.add(seq)
        if task.barrier:
            self.barriers.add(seq)

    def file(self, generation: int, seq: int, task: Task, chunk: Chunk) -> bool:
        """Keeps the result of task ``seq``; False (dropped) when it belongs to an earlier
        generation."""
        if generation != self.generation:
            return False
        self.done[seq] = (task, chunk)
        self.ready += task.size
        return True

    # -- the consumer's side ----------------------------------------------------------------

    def next_ready(self) -> int | None:
        """The sequence number the consumer may take now, or None."""
        done = self.done
        if self.in_order:
            return self.next_seq if self.next_seq in done else None
        if not self.barriers:
            return next(iter(done), None)
        lowest = min(self.outstanding)
        first_barrier = min(self.barriers)
        for seq in done:
            if seq in self.barriers:
                if seq == lowest:
                    return seq
            elif seq < first_barrier:
                return seq
        return None

    def take(self, seq: int) -> tuple[Chunk, int]:
        """Removes the result of task ``seq``; returns it with the positions that were in
        flight before (the occupancy the consumer saw)."""
        task, chunk = self.done.pop(seq)
        self.outstanding.discard(seq)
        self.barriers.discard(seq)
        self.ready -= task.size
        occupancy = self.in_flight
        self.in_flight -= task.size
        self.tasks_out -= 1
        if self.in_order:
            self.next_seq += 1
        return chunk, occupancy

    @property
    def waiting_for(self) -> int | None:
        """The sequence number whose result the consumer needs next (None: any)."""
        return self.next_seq if self.in_order else None
