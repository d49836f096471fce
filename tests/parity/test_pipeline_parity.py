"""PipelineBuilder against spdl 0.8.0: same outputs (input order: same sequence; completion
order: same multiset), same failure semantics and messages (except the S1 budget fix)."""

import asyncio
import fractions
import re

import pytest
import spdl.pipeline as spdl_pipeline

import gristmill.pipeline as gm_pipeline

pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("quiet_failure_logs")]
MODULES = {"gristmill": gm_pipeline, "spdl": spdl_pipeline}


def times10(x):
    return x * 10


def none_on_multiples_of_3(x):
    return None if x % 3 == 0 else x


def reverse(batch):
    return batch[::-1]


def pairs(x):
    for i in range(x):
        yield (x, i)


async def async_plus1(x):
    await asyncio.sleep(0.0005)
    return x + 1


async def async_pairs(x):
    for i in range(x):
        await asyncio.sleep(0)
        yield (x, i)


LOOKUP = {i: f"v{i}" for i in range(30)}


def _defs(m):
    import importlib

    return importlib.import_module(f"{m.__name__}.defs")


# Input-order pipelines: the same sequence.
ORDERED = {
    "map": lambda m: m.PipelineBuilder().add_source(range(30)).pipe(times10, output_order="input"),
    "map-concurrent": lambda m: (
        m.PipelineBuilder().add_source(range(50)).pipe(times10, concurrency=4, output_order="input")
    ),
    "none-drops": lambda m: (
        m.PipelineBuilder()
        .add_source(range(30))
        .pipe(none_on_multiples_of_3, concurrency=2, output_order="input")
    ),
    "reference-aggregate-chain": lambda m: (
        m.PipelineBuilder()
        .add_source(range(10))
        .aggregate(3)
        .pipe(lambda b: [x * 10 for x in b], output_order="input")
        .disaggregate()
        .aggregate(4, drop_last=True)
    ),
    "aggregate-keep-last": lambda m: (
        m.PipelineBuilder()
        .add_source(range(10))
        .pipe(none_on_multiples_of_3, concurrency=2, output_order="input")
        .aggregate(3)
        .pipe(reverse, output_order="input")
        .disaggregate()
        .aggregate(4)
    ),
    "async-map": lambda m: (
        m.PipelineBuilder()
        .add_source(range(40))
        .pipe(async_plus1, concurrency=8, output_order="input")
    ),
    "container-op": lambda m: (
        m.PipelineBuilder().add_source(range(30)).pipe(LOOKUP, output_order="input")
    ),
    "custom-aggregator": lambda m: (
        m.PipelineBuilder()
        .add_source(range(11))
        .aggregate(_defs(m).Collate(4))
        .pipe(sum, output_order="input")
    ),
    "async-source": lambda m: (
        m.PipelineBuilder().add_source(_async_range(12)).pipe(times10, output_order="input")
    ),
}

# Completion-order pipelines (timing-dependent order): the same multiset.
UNORDERED = {
    "map-completion": lambda m: (
        m.PipelineBuilder().add_source(range(60)).pipe(times10, concurrency=4)
    ),
    "generator": lambda m: m.PipelineBuilder().add_source(range(6)).pipe(pairs),
    "async-generator": lambda m: m.PipelineBuilder().add_source(range(6)).pipe(async_pairs),
    "async-completion": lambda m: (
        m.PipelineBuilder()
        .add_source(range(40))
        .pipe(async_plus1, concurrency=16)
        .pipe(times10, concurrency=2)
    ),
}


class _async_range:  # noqa: N801 (an async iterable, used like range)
    def __init__(self, n):
        self.n = n

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for i in range(self.n):
            await asyncio.sleep(0)
            yield i


def run(builder, threads=4):
    pipeline = builder.add_sink(3).build(num_threads=threads)
    try:
        return list(pipeline)
    finally:
        pipeline.stop()


@pytest.mark.parametrize("name", sorted(ORDERED))
def test_input_order_pipelines_give_the_same_sequence(name):
    build = ORDERED[name]
    expected = run(build(spdl_pipeline))
    assert run(build(gm_pipeline)) == expected
    assert run(build(gm_pipeline), threads=1) == expected


@pytest.mark.parametrize("name", sorted(UNORDERED))
def test_completion_order_pipelines_give_the_same_items(name):
    build = UNORDERED[name]
    assert sorted(run(build(gm_pipeline))) == sorted(run(build(spdl_pipeline)))


def fail_on_multiples_of_3(x):
    if x % 3 == 0:
        raise ValueError(f"bad {x}")
    return x


def drain(pipeline):
    out = []
    try:
        for item in pipeline:
            out.append(item)
    except Exception as e:
        error = e
    else:
        error = None
    finally:
        pipeline.stop()
    return out, error


def describe(error):
    if error is None:
        return None
    return (
        type(error).__name__,
        str(error),
        [(type(s).__name__, str(s), spdl_notes(s), repr(s.__cause__)) for s in error.exceptions],
    )


def spdl_notes(error):
    """The error's notes but gristmill's own (the failing item's source index, an addition
    to SPDL's notes)."""
    return [note for note in error.__notes__ if not note.startswith("gristmill:")]


@pytest.mark.parametrize(
    ("stage_kwargs", "build_kwargs", "n"),
    [
        ({}, {}, 10),  # unlimited: failing items dropped, normal end
        ({}, {"max_failures": 2}, 20),
        ({}, {"max_failures": 0}, 20),
        ({"max_failures": 1}, {}, 20),
        ({}, {"max_failures": fractions.Fraction(1, 10)}, 200),
        ({"max_failures": fractions.Fraction(1, 2)}, {}, 200),
    ],
)
def test_failure_budgets_match(stage_kwargs, build_kwargs, n):
    def build(m):
        builder = m.PipelineBuilder().add_source(range(n))
        builder.pipe(fail_on_multiples_of_3, output_order="input", **stage_kwargs)
        return builder.add_sink(3).build(num_threads=2, **build_kwargs)

    ours, our_error = drain(build(gm_pipeline))
    theirs, their_error = drain(build(spdl_pipeline))
    assert ours == theirs
    ours_described, theirs_described = describe(our_error), describe(their_error)
    if theirs_described is not None:  # pipeline ids differ between the two libraries
        theirs_described = _without_ids(theirs_described)
        ours_described = _without_ids(ours_described)
    assert ours_described == theirs_described


def _without_ids(described):
    return re.sub(r"\(\d+:\d+:|stage: \d+:\d+:", "(", str(described))


def test_a_failing_source_ends_with_its_error_after_its_items():
    def source():
        yield 1
        yield 2
        raise KeyError("src boom")

    results = {}
    for name, m in MODULES.items():
        out, error = drain(
            m.PipelineBuilder().add_source(source()).pipe(times10).add_sink(3).build(num_threads=1)
        )
        results[name] = (out, _without_ids(describe(error)))
    assert results["gristmill"] == results["spdl"]


def test_get_item_and_iterator_semantics_match():
    for m in MODULES.values():
        pipeline = (
            m.PipelineBuilder()
            .add_source(range(5))
            .pipe(times10, output_order="input")
            .add_sink(3)
            .build(num_threads=1)
        )
        with pipeline.auto_stop():
            with pytest.raises(RuntimeError, match=re.escape("The pipeline was already started.")):
                pipeline.start()
            first = []
            for item in pipeline.get_iterator():
                first.append(item)
                if len(first) == 2:
                    break
            assert first == [0, 10]
            assert list(pipeline.get_iterator()) == [20, 30, 40]  # resumes where it was
            with pytest.raises(EOFError, match=re.escape("Reached the end of the pipeline.")):
                pipeline.get_item()


async def async_uneven(x):
    await asyncio.sleep(0.001 * (x % 3))
    return x


@pytest.mark.parametrize(
    "build",
    [
        lambda m: m.PipelineBuilder().add_source(range(5), continuous=True).aggregate(2),
        lambda m: (
            m.PipelineBuilder()
            .add_source(range(9), continuous=True)
            .pipe(times10, concurrency=3, output_order="input")
            .aggregate(4, drop_last=True)
        ),
        lambda m: (
            m.PipelineBuilder()
            .add_source(range(6), continuous=True)
            .pipe(none_on_multiples_of_3, output_order="input")
            .aggregate(3)
            .disaggregate()
        ),
    ],
)
def test_continuous_sources_give_the_same_epochs(build):
    epochs = {}
    for name, m in MODULES.items():
        pipeline = build(m).add_sink(3).build(num_threads=2)
        with pipeline.auto_stop():
            epochs[name] = [list(pipeline.get_iterator()) for _ in range(3)]
    assert epochs["gristmill"] == epochs["spdl"]


def test_continuous_completion_order_never_mixes_epochs():
    """Uneven async delays reorder items inside an epoch, never across the boundary."""
    for m in MODULES.values():
        pipeline = (
            m.PipelineBuilder()
            .add_source(range(12), continuous=True)
            .pipe(async_uneven, concurrency=6)
            .add_sink(3)
            .build(num_threads=1)
        )
        with pipeline.auto_stop():
            for _ in range(4):
                assert sorted(pipeline.get_iterator()) == list(range(12))
            assert pipeline.get_item(timeout=5) in range(12)  # the next epoch goes on


def pid_and_value(x):
    import os

    return (os.getpid(), x * 10)


def pid_pairs(x):
    import os

    for i in range(x % 3):
        yield (os.getpid(), x, i)


@pytest.fixture(scope="module")
def process_pool():
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("fork")
    ) as pool:
        # A fork pool forks all its workers at the first submit: do it here, from the main
        # thread, not from a pipeline's worker thread (a child forked while another thread
        # holds a lock can deadlock on it).
        pool.submit(int).result()
        yield pool


def _on_pool(m, op, pool, order):
    import os

    pipeline = m.PipelineBuilder().add_source(range(12))
    pipeline.pipe(op, executor=pool, concurrency=3, output_order=order)
    items = run(pipeline, threads=2)
    assert all(item[0] != os.getpid() for item in items)  # ran in the pool's workers
    return [item[1:] for item in items]


def test_ops_on_a_process_pool_give_the_same_items(process_pool):
    for op in (pid_and_value, pid_pairs):
        ours = _on_pool(gm_pipeline, op, process_pool, "completion")
        assert sorted(ours) == sorted(_on_pool(spdl_pipeline, op, process_pool, "completion"))
    ours = _on_pool(gm_pipeline, pid_and_value, process_pool, "input")
    assert ours == _on_pool(spdl_pipeline, pid_and_value, process_pool, "input")


def test_a_generator_on_a_process_pool_in_input_order_works(process_pool):
    """Deliberate difference: spdl 0.8.0 fails every item of an input-order generator stage
    that has an executor ("object async_generator can't be used in 'await' expression") and
    delivers nothing; gristmill delivers the outputs, in order, as without an executor."""
    expected = [(x, i) for x in range(12) for i in range(x % 3)]
    assert _on_pool(gm_pipeline, pid_pairs, process_pool, "input") == expected
    assert _on_pool(spdl_pipeline, pid_pairs, process_pool, "input") == []


def test_a_failure_on_a_process_pool_has_the_same_message(process_pool):
    results = {}
    for name, m in MODULES.items():
        pipeline = (
            m.PipelineBuilder()
            .add_source(range(5))
            .pipe(fail_on_multiples_of_3, executor=process_pool, output_order="input")
            .add_sink(3)
            .build(num_threads=2, max_failures=0)
        )
        out, error = drain(pipeline)
        results[name] = (out, _without_ids(describe(error)))
    assert results["gristmill"] == results["spdl"]
    assert "Function failed in subprocess: ValueError: bad 0 (" in results["gristmill"][1]


def test_a_thread_pool_executor_runs_the_op():
    import concurrent.futures
    import threading

    def thread_name(x):
        return threading.current_thread().name.split("_")[0], x

    for m in MODULES.values():
        with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="userpool") as pool:
            pipeline = (
                m.PipelineBuilder()
                .add_source(range(6))
                .pipe(thread_name, executor=pool, output_order="input")
            )
            assert run(pipeline, threads=1) == [("userpool", x) for x in range(6)]


def test_after_stop_the_sink_buffer_is_read_then_eof():
    import time

    results = {}
    for name, m in MODULES.items():
        pipeline = m.PipelineBuilder().add_source(range(100)).pipe(times10).add_sink(2)
        pipeline = pipeline.build(num_threads=1)
        read = []
        with pipeline.auto_stop():
            read += [pipeline.get_item(timeout=30) for _ in range(3)]
            time.sleep(0.3)  # the stages fill the sink and block
        read += [pipeline.get_item(timeout=30) for _ in range(2)]
        with pytest.raises(EOFError):
            pipeline.get_item(timeout=30)
        results[name] = read
    assert results["gristmill"] == results["spdl"] == [0, 10, 20, 30, 40]
