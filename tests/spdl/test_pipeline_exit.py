"""A started pipeline that is never stopped does not hold the interpreter at exit; the exit
hook that ``start()`` registers does not keep the pipeline alive; and no gristmill thread
(the reaper included) outlives ``stop()`` or the collection of a pipeline."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

from gristmill.pipeline import PipelineBuilder

_HELD_AT_EXIT = textwrap.dedent(
    """
    import threading
    from gristmill.pipeline import PipelineBuilder

    def hold_a_thread(x):
        threading.Event().wait(0.01)
        return x

    pipeline = (
        PipelineBuilder()
        .add_source(range(10_000), continuous=True)
        .pipe(hold_a_thread, concurrency=2)
        .add_sink(4)
        .build(num_threads=2)
    )
    for i, _ in enumerate(pipeline.get_iterator(timeout=60)):
        if i == 10:
            break
    print("left running")
    """
)


def test_a_started_pipeline_left_running_does_not_hold_interpreter_exit():
    done = subprocess.run(
        [sys.executable, "-c", _HELD_AT_EXIT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "left running"


def test_the_exit_hook_registered_by_start_holds_the_pipeline_weakly():
    pipeline = PipelineBuilder().add_source(range(4)).add_sink(2).build(num_threads=1)
    pipeline.start()
    ref = weakref.ref(pipeline)
    del pipeline
    gc.collect()
    assert ref() is None


_NO_THREAD_OUTLIVES = textwrap.dedent(
    """
    import gc, threading, time
    from gristmill.pipeline import PipelineBuilder

    def ours():
        return [t.name for t in threading.enumerate() if t.name.startswith("gristmill")]

    def settle():
        deadline = time.monotonic() + 10
        while ours() and time.monotonic() < deadline:
            time.sleep(0.01)
        return ours()

    def build():
        return (
            PipelineBuilder().add_source(range(1000)).pipe(abs, concurrency=2)
            .add_sink(3).build(num_threads=2)
        )

    stopped = build()
    with stopped.auto_stop():
        next(iter(stopped.get_iterator(timeout=30)))
    print("after stop:", settle())
    dropped = build()
    dropped.start()
    next(iter(dropped.get_iterator(timeout=30)))
    assert ours()  # its threads run, and the reaper that will stop them if it is dropped
    del dropped
    gc.collect()
    print("after collection:", settle())
    """
)


def test_no_gristmill_thread_outlives_stop_or_the_collection_of_a_pipeline():
    done = subprocess.run(
        [sys.executable, "-c", _NO_THREAD_OUTLIVES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["after stop: []", "after collection: []"]
