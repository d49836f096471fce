"""One transport to local worker processes (``engine/transport.py``): a process stage
(``mp_prefetch``, ``DataLoader``) and a ``to(ProcessPoolExecutorConfig)`` region lease their
workers, talk to them in typed messages (``engine/messages.py``) and learn of a worker's
death through it, so a dead worker reads the same whichever stage it served."""

from __future__ import annotations

import ast
import multiprocessing
import os
import pathlib
import re
import signal

import pytest

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs, iterate_in_subprocess

pytestmark = pytest.mark.usefixtures("no_children_left")

SRC = pathlib.Path(gm.__file__).parent / "_src"  # the gristmill under test


def killed_at_3(x):
    if x == 3:  # mid-task: the worker's task holds 3 and more
        os.kill(os.getpid(), signal.SIGKILL)
    return x


class KilledAtThree(gm.transforms.Map):
    def map(self, x):
        return killed_at_3(x)


def mp_prefetch_failure():
    ds = gm.MapDataset.range(8).map(killed_at_3).to_iter_dataset()
    with pytest.raises(RuntimeError) as info:
        list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    return info.value


def data_loader_failure():
    loader = gm.DataLoader(
        data_source=list(range(8)),
        sampler=gm.samplers.SequentialSampler(8, gm.sharding.NoSharding()),
        operations=[KilledAtThree()],
        worker_count=2,
    )
    with pytest.raises(RuntimeError) as info:
        list(loader)
    return info.value


def region_failure():
    builder = PipelineBuilder().add_source(range(8))
    builder.to(defs.ProcessPoolExecutorConfig(max_workers=2)).pipe(killed_at_3)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(2).build(num_threads=1)
    with pytest.raises(PipelineFailure) as info:
        list(pipeline)
    pipeline.stop()
    (error,) = info.value.exceptions  # reported once
    return error


def killed_at_3_items():
    return map(killed_at_3, range(8))


def streamed_iterable_failure():
    with pytest.raises(RuntimeError) as info:
        list(iterate_in_subprocess(killed_at_3_items))
    return info.value


FAILURES = {"mp_prefetch": mp_prefetch_failure, "DataLoader": data_loader_failure}
FAILURES["to_region"] = region_failure
FAILURES["iterate_in_subprocess"] = streamed_iterable_failure


@pytest.mark.parametrize("stage", sorted(FAILURES))
def test_a_worker_killed_mid_task_reads_the_same_from_every_kind_of_stage(stage):
    error = FAILURES[stage]()
    message = str(error)
    assert type(error).__name__ == "WorkerDiedError", repr(error)
    assert isinstance(error, RuntimeError)
    assert re.search(r"worker process \d \(pid \d+\) of ", message), message
    said = "was terminated unexpectedly with exit code -9, killed by SIGKILL"
    assert message.count(said) == 1, message  # one notice, not one per watcher
    assert "out-of-memory killer" in message, message  # what a SIGKILL usually means


# -- the workers -----------------------------------------------------------------------------


def pid_of(_):
    return os.getpid()


class PidOf(gm.transforms.Map):
    def map(self, x):
        return pid_of(x)


def prefetch_pids():
    ds = gm.MapDataset.range(64).map(pid_of).to_iter_dataset()
    with iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2))) as it:
        return set(it)


def region_pids():
    builder = PipelineBuilder().add_source(range(64))
    builder.to(defs.ProcessPoolExecutorConfig(max_workers=2)).pipe(pid_of)
    pipeline = builder.to(defs.MAIN_PROCESS).add_sink(2).build(num_threads=1)
    with pipeline.auto_stop():
        return set(pipeline)


def data_loader_pids():
    loader = gm.DataLoader(
        data_source=list(range(64)),
        sampler=gm.samplers.SequentialSampler(64, gm.sharding.NoSharding()),
        operations=[PidOf()],
        worker_count=2,
    )
    with iter(loader) as it:
        return set(it)


def children():
    return {process.pid for process in multiprocessing.active_children()}


def test_a_process_stage_a_region_and_a_data_loader_run_on_the_same_pooled_workers():
    gm.multiprocessing.shutdown_idle_workers()
    first = prefetch_pids()
    workers = children()
    assert len(workers) == 2
    assert first <= workers
    assert region_pids() <= workers  # the region leased the stage's idle workers
    assert data_loader_pids() <= workers  # and gave them back
    assert prefetch_pids() <= workers
    assert children() == workers  # no process started or stopped


# -- the wire ---------------------------------------------------------------------------------

# the modules that speak the process-stage task protocol and the region protocol
SPEAKERS = (
    "engine/transport.py",
    "engine/process_lane.py",
    "engine/worker_pool.py",
    "spdl/regions.py",
    "spdl/region_worker.py",
    "spdl/region_processes.py",
    "ray/region.py",
    "ray/region_jobs.py",
)
# what the two protocols' messages were called when they travelled as tuples and strings
OLD_KINDS = {"job", "ok", "error", "end", "items", "epoch", "credit", "taken", "done"}


def untyped_messages(path: pathlib.Path) -> list[str]:
    """Where ``path`` sends a tuple, a string or None, or tells a message's kind by a
    string (``message[0] == "end"``, ``message == "end"``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("send", "put"):
            for arg in node.args[-1:]:
                if isinstance(arg, ast.Tuple) or (
                    isinstance(arg, ast.Constant)
                    and (arg.value is None or isinstance(arg.value, str))
                ):
                    found.append(f"{path.name}:{node.lineno} sends {ast.unparse(arg)}")
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in OLD_KINDS:
                    found.append(f"{path.name}:{node.lineno} matches {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", SPEAKERS)
def test_the_worker_protocols_travel_as_message_classes_not_tuples_or_strings(module):
    path = SRC / module
    assert untyped_messages(path) == []
    if module != "ray/region.py":  # which forwards the region's messages as they are
        assert "messages." in path.read_text()  # it speaks in engine/messages.py's classes


# -- one place waits on worker processes -------------------------------------------------------


def functions_that_wait(path: pathlib.Path) -> list[str]:
    """The functions of ``path`` that call ``multiprocessing.connection.wait`` (by any
    name: ``connection.wait``, ``wait`` imported from it) or wait on a process sentinel."""
    tree = ast.parse(path.read_text())
    imported = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "multiprocessing.connection"
        and any(alias.name == "wait" for alias in node.names)
        for node in ast.walk(tree)
    )
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            waits = called == "connection.wait" or (called == "wait" and imported)
            if waits or (called.endswith("wait") and "sentinel" in ast.unparse(node)):
                found.append(f"{path.relative_to(SRC)}:{function.name}")
                break
    return found


def test_only_the_transport_waits_on_worker_processes():
    waiting = sorted(found for path in SRC.rglob("*.py") for found in functions_that_wait(path))
    parents = [f for f in waiting if f.startswith(WORKER_SIDE)]
    assert sorted(set(waiting) - set(parents)) == ["engine/transport.py:receive"]


# the worker's side: these wait on their pipe and their parent's sentinel, not on workers
WORKER_SIDE = ("engine/parent_watch.py", "engine/iterable_job.py")


# -- one driver per kind of region worker ----------------------------------------------------


def region_drivers(path: pathlib.Path) -> list[str]:
    """The functions of ``path`` that hand a region its workers' messages or deaths
    (``region.received(index, message)``, ``region.died(index, error)``), and the classes
    that define a region transport's ``collect`` (``regions.RegionWorkers``)."""
    found = []
    for scope in ast.walk(ast.parse(path.read_text())):
        if isinstance(scope, ast.ClassDef):
            methods = {node.name for node in scope.body if isinstance(node, ast.FunctionDef)}
            if "collect" in methods:
                found.append(f"{path.relative_to(SRC)}:{scope.name}.collect")
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("received", "died")
                and len(node.args) == 2
            ):
                found.append(f"{path.relative_to(SRC)}:{scope.name}")
                break
    return found


def test_a_region_has_one_driver_per_kind_of_worker_and_ray_has_none_of_its_own():
    # local processes (their sentinels) and any region backend (a RayBackend too, whose
    # actors' replies come through RegionReplies): no third collector, none in ray/
    found = sorted({f for path in SRC.rglob("*.py") for f in region_drivers(path)})
    assert found == [
        "spdl/region_backend.py:BackendWorkers.collect",
        "spdl/region_backend.py:collect",
        "spdl/region_processes.py:ProcessWorkers.collect",
        "spdl/region_processes.py:collect",
        "spdl/regions.py:RegionWorkers.collect",  # the protocol the two implement
    ]
    assert not [f for f in found if f.startswith("ray/")]
