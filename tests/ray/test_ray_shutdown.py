"""Shutting Ray down after ``backend.shutdown()``, or exiting with a stage still running, ends
cleanly: no gristmill thread is inside a Ray call then (Ray ends a process whose threads use
it after ``ray.shutdown()``)."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

MAIN = """
if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    first = RayBackend(2, {"num_cpus": 0.25})
    it = running(first)
    first.shutdown()
    ray.shutdown()  # its threads are out of Ray: the process lives on
    stopped(it)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    left_open = running(RayBackend(2, {"num_cpus": 0.25}))
    print("exiting with it running")
"""

SCRIPT = textwrap.dedent(
    """
    import time
    import ray
    import gristmill as gm
    from gristmill.ray import BackendShutDownError, RayBackend

    def slow(x):
        time.sleep(0.002)
        return x

    def running(backend):
        ds = gm.MapDataset.range(2000).map(slow).to_iter_dataset()
        it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2), backend=backend))
        assert [next(it) for _ in range(20)] == list(range(20))
        return it

    def stopped(it):
        try:
            list(it)
        except BackendShutDownError:
            print("stage stopped")
    """
)

REGION_SCRIPT = textwrap.dedent(
    """
    import threading
    import time
    import ray
    from gristmill.pipeline import PipelineBuilder, PipelineFailure, defs
    from gristmill.ray import RayBackend

    def slow(x):
        time.sleep(0.002)
        return x

    def running(backend):
        builder = PipelineBuilder().add_source(range(2000)).to(backend).pipe(slow)
        it = iter(builder.to(defs.MAIN_PROCESS).add_sink(3).build(num_threads=2))
        assert len([next(it) for _ in range(20)]) == 20
        return it

    def stopped(it):
        try:
            list(it)
        except PipelineFailure as failure:
            print("region stopped:", "RayBackend was shut down" in str(failure.exceptions[0]))
        pumps = [t for t in threading.enumerate() if t.name.endswith("-ray-pump")]
        print("pumps left:", len(pumps))
    """
)


# a stage's threads, and a to(RayBackend) region's pump thread, woken by the shutdown, leave
# Ray alone; an iterator left open is cleaned up at exit (the runtime shuts the pool down)
RUNS = {
    "stage": (SCRIPT, ["stage stopped", "exiting with it running"]),
    "region": (REGION_SCRIPT, ["region stopped: True", "pumps left: 0", "exiting with it running"]),
}


@pytest.mark.parametrize("kind", sorted(RUNS))
def test_ray_shutdown_after_backend_shutdown_and_exit_mid_run_end_cleanly(tmp_path, kind):
    text, said = RUNS[kind]
    script = tmp_path / "script.py"
    script.write_text(text + MAIN)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[: len(said)] == said
    assert "core worker has already been shutdown" not in done.stderr
