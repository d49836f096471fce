"""One runtime per process: it stops what still runs at interpreter exit, and a forked child
starts without it — the child runs none of the parent's exit work, waits for none of its
threads and touches none of its workers (engine/runtime.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from scripts import python_output, run_python  # noqa: E402

_POOL_CYCLES = textwrap.dedent(
    """
    import concurrent.futures, multiprocessing
    from gristmill.pipeline import PipelineBuilder

    def plus_one(x):
        return x + 1

    if __name__ == "__main__":
        fork = multiprocessing.get_context("fork")
        for cycle in range(100):
            executor = concurrent.futures.ProcessPoolExecutor(2, mp_context=fork)
            pipeline = (
                PipelineBuilder().add_source(range(40))
                .pipe(plus_one, executor=executor, concurrency=4)
                .add_sink(3).build(num_threads=4)
            )
            with pipeline.auto_stop():  # the pool's workers are forked from stage threads
                assert sorted(pipeline.get_iterator(timeout=60)) == list(range(1, 41))
            executor.shutdown()  # waits for the workers' exit
        print("cycles done")
    """
)


def test_cycles_of_a_pipeline_on_a_forked_process_pool_end(tmp_path):
    # The pool's workers are forked from a stage thread: each inherited the pipeline's
    # stop-at-exit hook and, at its own exit, waited for ever on the copied pipeline.
    assert python_output(["-c", _POOL_CYCLES], tmp_path).split() == ["cycles", "done"]


_EXIT_AFTER_A_STAGE_ERROR = textwrap.dedent(
    """
    import concurrent.futures, multiprocessing
    from gristmill.pipeline import PipelineBuilder, PipelineFailure

    def fail_at_7(x):
        if x == 7:
            raise ValueError("bad 7")
        return x

    if __name__ == "__main__":
        fork = multiprocessing.get_context("fork")
        executor = concurrent.futures.ProcessPoolExecutor(2, mp_context=fork)
        pipeline = (
            PipelineBuilder().add_source(range(1000))
            .pipe(fail_at_7, executor=executor, concurrency=4)
            .add_sink(3).build(num_threads=4, max_failures=0)
        )
        try:
            for _ in pipeline.get_iterator(timeout=60):
                pass
        except PipelineFailure:
            print("stage failed")
        # neither the pipeline nor the executor is stopped: interpreter exit does it
    """
)


def test_the_interpreter_exits_after_a_stage_error_on_a_forked_process_pool(tmp_path):
    out = python_output(["-c", _EXIT_AFTER_A_STAGE_ERROR], tmp_path)
    assert out.split() == ["stage", "failed"]


_FORK_WHILE_RUNNING = textwrap.dedent(
    """
    import functools, multiprocessing, os, sys, threading, time
    import gristmill as gm
    import gristmill.python as gp
    from gristmill.pipeline import PipelineBuilder, defs, iterate_in_subprocess

    N = 200

    def slow(x):
        time.sleep(0.001)
        return x

    def running(kind):
        ds = gm.MapDataset.range(N).map(slow)
        if kind == "mp_prefetch":
            options = gm.MultiprocessingOptions(num_workers=2)
            return iter(ds.to_iter_dataset().mp_prefetch(options))
        if kind == "DataLoader":
            return iter(gm.DataLoader(
                data_source=ds, sampler=gp.SequentialSampler(N, gp.NoSharding()),
                worker_count=2,
            ))
        if kind == "iterate_in_subprocess":
            return iter(iterate_in_subprocess(functools.partial(map, slow, range(N))))
        builder = PipelineBuilder().add_source(range(N))
        if kind == "to_region":
            builder.to(defs.ProcessPoolExecutorConfig(max_workers=2, mp_context="fork"))
            builder.pipe(slow, concurrency=2).to(defs.MAIN_PROCESS)
        else:  # a pipeline on threads
            builder.pipe(slow, concurrency=2)
        return iter(builder.add_sink(3).build(num_threads=2))

    def noop():
        pass

    def exit_in_a_forked_child(how):
        # how the child ended: its exit code, or "hung"
        if how == "process forked from a thread":  # as a stdlib process pool forks
            result = []
            def start_one():
                child = multiprocessing.get_context("fork").Process(target=noop)
                child.start()
                child.join(30)
                result.append("hung" if child.exitcode is None else child.exitcode)
                if child.exitcode is None:
                    child.kill()
                    child.join()
            thread = threading.Thread(target=start_one)
            thread.start()
            thread.join()
            return result[0]
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the interpreter's normal exit: its exit hooks and finalisers run
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"

    if __name__ == "__main__":
        it = running(sys.argv[1])
        got = [int(next(it)) for _ in range(10)]
        print("child", exit_in_a_forked_child(sys.argv[2]))
        got += [int(x) for x in it]
        print("parent", sorted(got) == list(range(N)))
    """
)

KINDS = ["mp_prefetch", "DataLoader", "iterate_in_subprocess", "to_region", "threads"]


@pytest.mark.parametrize("how", ["os.fork", "process forked from a thread"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_forked_child_exits_at_once_and_leaves_the_parents_workers_alone(tmp_path, kind, how):
    # On the interpreter's normal exit an os.fork child ran the parent's exit hooks on its
    # copies: it terminated the parent's worker processes (the parent's read then failed:
    # "terminated by another process") or failed joining them ("can only join a child
    # process"); a stdlib pool's worker, forked from a thread, inherits the same state.
    done = run_python(["-c", _FORK_WHILE_RUNNING, kind, how], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines() == ["child 0", "parent True"]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]


_CHILD_STARTS_EMPTY = textwrap.dedent(
    """
    import os, sys
    import gristmill as gm
    from gristmill._src.engine import runtime

    if __name__ == "__main__":
        options = gm.MultiprocessingOptions(num_workers=2)
        it = iter(gm.MapDataset.range(50).to_iter_dataset().mp_prefetch(options))
        next(it)
        print("parent", runtime.counts()["cores"] > 0, flush=True)
        pid = os.fork()
        if pid == 0:
            print("child", runtime.counts(), flush=True)
            # the child's own workers: new ones, its own children
            again = gm.MapDataset.range(20).to_iter_dataset().mp_prefetch(options)
            print("child read", [int(x) for x in again] == list(range(20)), flush=True)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent read", [int(x) for x in it] == list(range(1, 50)))
    """
)


def test_a_forked_child_starts_with_an_empty_runtime_and_its_own_workers(tmp_path):
    out = python_output(["-c", _CHILD_STARTS_EMPTY], tmp_path)
    empty = {"pipelines": 0, "cores": 0, "handles": 0, "pools": 0}
    assert out.splitlines() == [
        "parent True",
        f"child {empty}",
        "child read True",
        "child exit 0",
        "parent read True",
    ]


_USER_THREAD_AT_EXIT = textwrap.dedent(
    """
    import threading, time
    import gristmill as gm
    from gristmill.pipeline import PipelineBuilder

    def slow(x):
        time.sleep(0.001)
        return x

    def read_a_dataset():
        options = gm.MultiprocessingOptions(num_workers=2)
        ds = gm.MapDataset.range(300).map(slow).to_iter_dataset().mp_prefetch(options)
        print("dataset", sum(1 for _ in ds), flush=True)

    def wait_on_a_pipeline(pipeline):
        try:
            for _ in pipeline.get_iterator(timeout=None):
                pass
        finally:
            print("pipeline stopped", flush=True)

    if __name__ == "__main__":
        pipeline = (
            PipelineBuilder().add_source(range(10**9), continuous=True)
            .pipe(slow).add_sink(2).build(num_threads=1)
        )
        pipeline.start()
        threads = [
            threading.Thread(target=read_a_dataset),
            threading.Thread(target=wait_on_a_pipeline, args=(pipeline,)),
        ]
        for thread in threads:
            thread.start()
        # the main thread ends here: the interpreter stops the pipeline (its reader would
        # wait for ever) and then joins both threads; the dataset is read to its end
    """
)


def test_at_exit_a_pipeline_is_stopped_before_the_threads_join_and_a_dataset_read_finishes(
    tmp_path,
):
    out = python_output(["-c", _USER_THREAD_AT_EXIT], tmp_path)
    assert sorted(out.splitlines()) == ["dataset 300", "pipeline stopped"]


def test_each_started_pipeline_registers_its_own_stop_before_the_thread_joins(monkeypatch):
    """As SPDL: every ``start()`` registers one hook with ``threading._register_atexit``
    (which runs the last registered first, so before the pools imported earlier); a hook
    stops its own pipeline only, and a second trigger finds it stopped."""
    import threading

    from gristmill.pipeline import PipelineBuilder

    hooks = []
    monkeypatch.setattr(threading, "_register_atexit", hooks.append)

    def started():
        pipeline = (
            PipelineBuilder().add_source(range(10**9)).pipe(abs).add_sink(2).build(num_threads=1)
        )
        pipeline.start()
        return pipeline

    first, second = started(), started()
    try:
        assert len(hooks) == 2
        hooks[1]()  # the second start's hook
        with pytest.raises(EOFError):  # stopped: what its sink holds, then the end
            _read_all(second)
        assert isinstance(first.get_item(timeout=60), int)  # the first one still runs
        hooks[1]()  # again: nothing left to stop
    finally:
        first.stop()
        second.stop()


def _read_all(pipeline):
    for _ in range(10**6):
        pipeline.get_item(timeout=60)
