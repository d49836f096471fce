"""The engine's runners chained by hand (``tests/support/chain.py``): stages on inline,
thread and asyncio executors.

The chain builds ``ChunkRunner`` / ``StreamFeed`` pieces directly, below both dialects, so
these tests check the pieces themselves: output for every executor/concurrency mix, fusion,
order, errors, positions, knobs changed while running, statistics, and shutdown with no
thread left.
"""

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from chain import IndexSource, Plan, Stage  # noqa: E402


def gristmill_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gristmill[")]


def add1(x):
    return x + 1


def triple(x):
    return x * 3


def slow_neg(x):
    time.sleep(0.0003)
    return -x


async def async_double(x):
    await asyncio.sleep(0)
    return x * 2


async def async_slow_double(x):
    await asyncio.sleep(0.001)
    return x * 2


def expected(n, *fns):
    out = list(range(n))
    for fn in fns:
        out = [fn(x) if not asyncio.iscoroutinefunction(fn) else asyncio.run(fn(x)) for x in out]
    return out


STAGE_MIXES = {
    "inline-only": [Stage(add1), Stage(triple)],
    "threads": [Stage(add1), Stage(slow_neg, executor="threads", concurrency=4)],
    "asyncio": [Stage(async_double, executor="asyncio", concurrency=8)],
    "asyncio-then-inline": [
        Stage(async_slow_double, executor="asyncio", concurrency=16),
        Stage(add1),
    ],
    "all-kinds": [
        Stage(add1),
        Stage(async_slow_double, executor="asyncio", concurrency=16),
        Stage(triple),
        Stage(slow_neg, executor="threads", concurrency=3),
        Stage(add1),
    ],
    "cheap-threads-stage": [Stage(triple, executor="threads", concurrency=4)],
}


@pytest.mark.parametrize("mix", sorted(STAGE_MIXES))
@pytest.mark.parametrize("source_threads", [0, 2])
def test_output_equals_the_serial_composition(mix, source_threads):
    stages = STAGE_MIXES[mix]
    source = IndexSource.from_sequence(range(700), concurrency=source_threads, buffer_size=32)
    with iter(Plan(source, stages)) as it:
        out = list(it)
    assert out == expected(700, *(s.fn for s in stages))


def test_adjacent_inline_stages_are_fused():
    plan = Plan(
        IndexSource.from_sequence(range(5), name="src"),
        [
            Stage(add1),
            Stage(triple),
            Stage(async_double, executor="asyncio"),
            Stage(add1, name="plus"),
            Stage(slow_neg, executor="threads", concurrency=2),
        ],
    )
    assert plan.stage_names == ("src → add1 → triple", "async_double → plus", "slow_neg")


class AsyncProbe:
    """An async function that counts overlapping calls and the loop's live tasks."""

    def __init__(self):
        self.active = 0
        self.most = 0
        self.most_tasks = 0

    async def __call__(self, x):
        self.active += 1
        self.most = max(self.most, self.active)
        self.most_tasks = max(self.most_tasks, len(asyncio.all_tasks()))
        await asyncio.sleep(0.002)
        self.active -= 1
        return x


def test_asyncio_stage_overlaps_calls_without_a_task_per_element():
    probe = AsyncProbe()
    stage = Stage(probe, executor="asyncio", concurrency=12, buffer_size=96)
    with iter(Plan(IndexSource.from_sequence(range(400)), [stage])) as it:
        assert list(it) == list(range(400))
        (_, async_stage) = it.statistics().stages
    assert probe.most == 12
    assert probe.most_tasks <= 12  # one long-lived task per slot, none per element
    assert async_stage.executor == "asyncio"
    assert async_stage.tasks < 400 // 10  # a hand-off carries many elements


def waits_for_the_next():
    """An async function whose element 0 finishes only after element 1 has."""
    release = None

    async def fn(x):
        nonlocal release
        if release is None:
            release = asyncio.Event()
        if x == 0:
            await release.wait()
        elif x == 1:
            release.set()
        return x

    return fn


@pytest.mark.parametrize("order", ["input", "completion"])
def test_output_order(order):
    stage = Stage(
        waits_for_the_next(), executor="asyncio", concurrency=2, buffer_size=4, output_order=order
    )
    with iter(Plan(IndexSource.from_sequence(range(8)), [stage])) as it:
        out = list(it)
        if order == "completion":
            with pytest.raises(ValueError, match="output_order='completion'"):
                it.position  # noqa: B018
        else:
            assert it.position == 8
    if order == "completion":
        assert out[0] == 1  # the later element passed the waiting one
        assert sorted(out) == list(range(8))
    else:
        assert out == list(range(8))


class FailOnce:
    def __init__(self, index):
        self.index = index
        self.failed = False

    def check(self, x):
        if x == self.index and not self.failed:
            self.failed = True
            raise KeyError(f"bad element {x}")
        return x


@pytest.mark.parametrize("executor", ["inline", "threads", "asyncio"])
def test_error_names_stage_and_index_and_a_retry_continues(executor):
    fail = FailOnce(123)
    if executor == "asyncio":

        async def fn(x):
            return fail.check(x)

    else:

        def fn(x):
            return fail.check(x)

    stages = [Stage(add1), Stage(fn, executor=executor, concurrency=3, name="checker")]
    with iter(Plan(IndexSource.from_sequence(range(300)), stages)) as it:
        got = [next(it) for _ in range(122)]
        with pytest.raises(KeyError, match="bad element 123") as info:
            next(it)
        note = "\n".join(info.value.__notes__)
        assert "checker" in note or "source → add1 → checker" in note
        assert "element index 122" in note
        assert it.position == 122
        got += list(it)
    assert got == list(range(1, 301))


def test_error_in_an_upstream_stage_is_named_once_and_passes_through():
    def boom(x):
        if x == 50:
            raise ValueError("upstream broke")
        return x

    stages = [
        Stage(boom, executor="threads", concurrency=2, name="boom"),
        Stage(async_double, executor="asyncio", concurrency=4),
    ]
    with iter(Plan(IndexSource.from_sequence(range(100)), stages)) as it:
        got = [next(it) for _ in range(50)]
        with pytest.raises(ValueError, match="upstream broke") as info:
            next(it)
    assert got == [2 * x for x in range(50)]
    assert info.value.__notes__ == ["gristmill: raised in stage 'boom' at element index 50"]


@pytest.mark.parametrize("at", [0, 1, 37, 299, 300])
def test_seek_continues_exactly_under_other_concurrency(at):
    def build(concurrency):
        return Plan(
            IndexSource.from_sequence(range(300), concurrency=concurrency),
            [
                Stage(async_double, executor="asyncio", concurrency=concurrency + 1),
                Stage(slow_neg, executor="threads", concurrency=concurrency + 1),
            ],
        )

    with iter(build(1)) as first:
        for _ in range(at):
            next(first)
        position = first.position
    assert position == at
    with iter(build(3)) as second:
        second.seek(position)
        assert list(second) == [-2 * x for x in range(at, 300)]
    with build(2).iterate(start=position) as third:
        assert list(third) == [-2 * x for x in range(at, 300)]


def test_knobs_change_while_running_without_changing_output():
    stages = [
        Stage(slow_neg, executor="threads", concurrency=1, name="work"),
        Stage(async_slow_double, executor="asyncio", concurrency=2, name="io"),
    ]
    with iter(Plan(IndexSource.from_sequence(range(600)), stages)) as it:
        out = [next(it) for _ in range(100)]
        it.configure("work", concurrency=4, buffer_size=128)
        it.configure("io", concurrency=16)
        out += [next(it) for _ in range(300)]
        it.configure(2, concurrency=1, buffer_size=8)
        it.configure("work", concurrency=2)
        out += list(it)
        stats = {s.name: s for s in it.statistics().stages}
        assert it.runner("work").knobs == {"workers": 2, "buffer_size": 128}
    assert out == [-2 * x for x in range(600)]
    assert stats["io"].concurrency == 1
    assert stats["io"].buffer_size == 8
    with pytest.raises(KeyError, match="no stage named 'nope'"):
        it.runner("nope")


def test_statistics_per_stage():
    stages = [Stage(slow_neg, executor="threads", concurrency=2), Stage(add1)]
    with iter(Plan(IndexSource.from_sequence(range(200), name="numbers"), stages)) as it:
        list(it)
        stats = it.statistics()
    names = [s.name for s in stats.stages]
    assert names == ["numbers", "slow_neg → add1"]
    assert all(s.elements_out == 200 for s in stats.stages)
    assert stats.stages[1].executor == "threads"
    assert isinstance(stats.bottleneck(), str)


def test_close_stops_a_stage_blocked_in_an_await():
    async def never(x):
        await asyncio.Event().wait()

    it = iter(Plan(IndexSource.from_sequence(range(10)), [Stage(never, executor="asyncio")]))
    it.start_prefetch()
    deadline = time.monotonic() + 5
    while len(gristmill_threads()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    closer = threading.Thread(target=lambda: (it.close(), it.close()))  # idempotent
    closer.start()
    closer.join(30)  # the await never ends by itself: close() must cancel it
    assert not closer.is_alive(), "close() waited for an await that never ends"
    assert not gristmill_threads()
    with pytest.raises(RuntimeError, match="closed"):
        next(it)


@pytest.mark.parametrize("how", ["break", "del"])
def test_dropping_a_running_plan_stops_every_thread(how):
    stages = [
        Stage(slow_neg, executor="threads", concurrency=3),
        Stage(async_slow_double, executor="asyncio", concurrency=4),
    ]
    source = IndexSource.from_sequence(range(10_000), concurrency=2)
    it = iter(Plan(source, stages))
    for i, _ in enumerate(it):
        if i == 50:
            break
    assert gristmill_threads()
    if how == "del":
        del it
    else:
        it.close()
    gc.collect()
    deadline = time.monotonic() + 2
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fn": 3}, TypeError, "Stage fn must be callable, got 3"),
        ({"fn": add1, "executor": "process"}, ValueError, "executor must be one of"),
        ({"fn": add1, "executor": "asyncio"}, TypeError, "is not an async function"),
        ({"fn": async_double, "executor": "threads"}, TypeError, "use executor='asyncio'"),
        ({"fn": add1, "concurrency": 0}, ValueError, "concurrency must be an int >= 1, got 0"),
        ({"fn": add1, "concurrency": True}, ValueError, "concurrency must be an int >= 1"),
        ({"fn": add1, "output_order": "random"}, ValueError, "output_order must be one of"),
        (
            {"fn": add1, "output_order": "completion"},
            ValueError,
            "needs a concurrent executor",
        ),
        ({"fn": add1, "buffer_size": 0}, ValueError, "buffer_size must be an int >= 1 or None"),
    ],
)
def test_bad_stage_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        Stage(**kwargs)


def test_bad_plan_arguments():
    with pytest.raises(TypeError, match="source must be an IndexSource"):
        Plan(range(3))
    with pytest.raises(TypeError, match=r"stages\[1\] must be a Stage"):
        Plan(IndexSource.from_sequence(range(3)), [Stage(add1), add1])
    plan = Plan(IndexSource.from_sequence(range(3)))
    with pytest.raises(ValueError, match=r"start must be in \[0, 3\], got 4"):
        plan.iterate(4)
    with iter(plan) as it:
        with pytest.raises(ValueError, match=r"position must be in \[0, 3\], got -1"):
            it.seek(-1)
        assert list(it) == [0, 1, 2]


def test_keyboard_interrupt_in_a_stage_stops_every_thread():
    def interrupt_at_30(x):
        if x == -60:  # source element 30, doubled and negated
            raise KeyboardInterrupt
        return x

    stages = [
        Stage(async_double, executor="asyncio", concurrency=4),
        Stage(slow_neg, executor="threads", concurrency=2),
        Stage(interrupt_at_30),
    ]
    it = iter(Plan(IndexSource.from_sequence(range(10_000), concurrency=2), stages))
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            pass
    deadline = time.monotonic() + 1.0
    while gristmill_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gristmill_threads()


def test_interpreter_exit_with_running_stages_is_silent_and_prompt():
    script = textwrap.dedent(
        """
        import asyncio, sys, time
        sys.path.insert(0, SUPPORT)
        from chain import IndexSource, Plan, Stage
        async def wait(x):
            await asyncio.sleep(0.01)
            return x
        def slow(x):
            time.sleep(0.01)
            return x
        plan = Plan(
            IndexSource.from_sequence(range(10**6), concurrency=2),
            [Stage(wait, executor="asyncio", concurrency=8),
             Stage(slow, executor="threads", concurrency=4)],
        )
        it = iter(plan)
        print(next(it), next(it))
        """
    )
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script.replace("SUPPORT", repr(str(SUPPORT)))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"]
    assert result.stderr == ""
    assert time.monotonic() - start < 10
