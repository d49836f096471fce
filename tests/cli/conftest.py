"""What the ``gristmill profile`` tests share: a module of pipelines whose slow stage is known
(as in tests/engine/test_verdict.py), written where a user's would be."""

import sys
import textwrap
import uuid

import pytest

PIPELINES = textwrap.dedent(
    '''
    """Pipelines whose slow stage is known, for `gristmill profile`."""

    import time

    import gristmill as gm
    from gristmill.pipeline import PipelineBuilder

    SLOW_S = 2e-3


    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


    def slow(x):
        spin(SLOW_S)
        return x


    def cheap(x):
        return x + 1


    def slow_keep(x):
        spin(SLOW_S)
        return x % 2 == 0


    def map_dataset():
        return gm.MapDataset.range(200).map(cheap).map(slow)


    def endless():
        return gm.MapDataset.range(10**9).map(cheap)


    def iter_dataset():
        read = gm.MapDataset.range(200).to_iter_dataset(gm.ReadOptions(num_threads=0))
        return read.map(cheap).filter(slow_keep).batch(10)


    def iterator():
        return iter(iter_dataset())


    def pipeline():
        return (
            PipelineBuilder()
            .add_source(range(200))
            .pipe(cheap)
            .pipe(slow)
            .aggregate(10)
            .pipe(sum)
            .add_sink(3)
            .build(num_threads=2)
        )


    def a_list():
        return [1, 2, 3]


    not_a_function = 42
    '''
)


@pytest.fixture(scope="session")
def pipelines_source():
    """The text of the module of pipelines (for a test that runs it its own way)."""
    return PIPELINES


@pytest.fixture
def pipelines_module(tmp_path, monkeypatch):
    """The path of a fresh copy of PIPELINES (a unique module name: each test imports its
    own); ``sys.path`` and ``sys.modules`` are restored afterwards."""
    name = f"profiled_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(PIPELINES)
    monkeypatch.setattr(sys, "path", [*sys.path])
    yield path
    sys.modules.pop(name, None)
