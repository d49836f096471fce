"""What a user reads when their function raises in a worker process: a script file run with
``python script.py``, for every backend that runs the user's code in another process.

The traceback names the user's file and line and shows the source line (a function sent by
value keeps its file name), prints the worker's part once, and ends near the user's line.
"""

import linecache
import sys
import textwrap
import traceback
from pathlib import Path

import pytest

import gristmill as gm

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from scripts import run_python  # noqa: E402

_HEADER = """
import sys
from concurrent.futures import ProcessPoolExecutor

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, iterate_in_subprocess
from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig


def transform(x):
    if x == 5:
        raise ValueError(f"bad element {x}")
    return x * 2
"""
RAISING_LINE = 'raise ValueError(f"bad element {x}")'
RAISING_LINENO = _HEADER.splitlines().index(f"        {RAISING_LINE}") + 1

_MAINS = {
    "mp_prefetch": """
        ds = gm.MapDataset.range(10).map(transform).to_iter_dataset()
        list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    """,
    "mp_prefetch_grain_order": """
        options = gm.MultiprocessingOptions(
            num_workers=2, order=gm.multiprocessing.MultiprocessingOrder.GRAIN_PER_WORKER
        )
        list(gm.MapDataset.range(10).to_iter_dataset().map(transform).mp_prefetch(options))
    """,
    "data_loader": """
        class Double(gm.transforms.Map):
            def map(self, x):
                return transform(x)

        sampler = gm.samplers.IndexSampler(
            10, shard_options=gm.sharding.NoSharding(), num_epochs=1
        )
        loader = gm.DataLoader(
            data_source=list(range(10)), sampler=sampler, operations=[Double()], worker_count=2
        )
        list(loader)
    """,
    "spdl_region": """
        builder = PipelineBuilder().add_source(range(10))
        builder.to(ProcessPoolExecutorConfig(max_workers=2)).pipe(transform).to(MAIN_PROCESS)
        pipeline = builder.add_sink(3).build(num_threads=1)
        with pipeline.auto_stop():
            assert len(list(pipeline)) == 9  # the failed item is logged and dropped
    """,
    "spdl_process_pool_executor": """
        with ProcessPoolExecutor(2) as executor:
            builder = PipelineBuilder().add_source(range(10)).pipe(transform, executor=executor)
            pipeline = builder.add_sink(3).build(num_threads=1)
            with pipeline.auto_stop():
                assert len(list(pipeline)) == 9  # the failed item is logged and dropped
    """,
    "iterate_in_subprocess": """
        list(iterate_in_subprocess(numbers))
    """,
}


def numbers_source():
    return "\n\ndef numbers():\n    return map(transform, range(10))\n"


def script_text(backend):
    body = textwrap.indent(textwrap.dedent(_MAINS[backend]).strip(), "    ")
    return (
        f"{_HEADER}{numbers_source()}\n\ndef main():\n{body}\n\n\n"
        'if __name__ == "__main__":\n    main()\n'
    )


def run_script(tmp_path, backend):
    path = tmp_path / "user_script.py"
    path.write_text(script_text(backend))
    done = run_python([path], tmp_path)
    return path, done


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(_MAINS))
def test_a_worker_error_shows_the_users_file_and_line_once_near_the_end(tmp_path, backend):
    path, done = run_script(tmp_path, backend)
    stderr = done.stderr
    assert "<dynamic-code>" not in stderr, stderr
    where = f'File "{path}", line {RAISING_LINENO}, in transform'
    assert stderr.count(where) == 1, stderr  # the worker's part, once
    assert stderr.count(RAISING_LINE) == 1, stderr
    last = stderr.rstrip().splitlines()[-15:]
    assert any(RAISING_LINE in line for line in last), stderr
    assert any("bad element 5" in line for line in last), stderr
    if backend in ("mp_prefetch", "data_loader"):
        assert done.returncode == 1
        assert "at element index 5" in stderr
    if backend == "iterate_in_subprocess":
        assert done.returncode == 1
        assert "Failed to fetch the next item" in stderr
        assert "raised in stage 'iterate_in_subprocess(numbers)' at element index 5" in stderr


# A file only the worker can read (as on another machine): the worker's line is shown.
_ELSEWHERE = "/nonexistent/on-the-workers-machine.py"


def _worker_reads_the_file(worker_index, worker_count):
    lines = ["\n", "def fail(x):\n", "    raise KeyError(x)  # elsewhere\n"]
    linecache.cache[_ELSEWHERE] = (sum(map(len, lines)), None, lines, _ELSEWHERE)


def _raises_elsewhere():
    namespace = {}
    exec(compile("\ndef fail(x):\n    raise KeyError(x)\n", _ELSEWHERE, "exec"), namespace)
    return namespace["fail"]


def test_a_source_line_only_the_worker_can_read_is_shown_as_the_worker_read_it():
    fail = _raises_elsewhere()
    assert linecache.getline(_ELSEWHERE, 3) == ""
    ds = gm.MapDataset.range(4).map(fail).to_iter_dataset()
    options = gm.MultiprocessingOptions(num_workers=1)
    it = iter(ds.mp_prefetch(options, worker_init_fn=_worker_reads_the_file))
    with it, pytest.raises(KeyError) as info:
        next(it)
    innermost = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (innermost.filename, innermost.lineno) == (_ELSEWHERE, 3)
    assert innermost.line == "raise KeyError(x)  # elsewhere"


def _looks_up(x):
    try:
        return {}[x]
    except KeyError as missing:
        raise ValueError(f"no entry for {x}") from missing


def test_a_worker_error_keeps_the_exception_it_was_raised_from_with_its_frames():
    ds = gm.MapDataset.range(4).map(_looks_up).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1)))
    with it, pytest.raises(ValueError, match="no entry for 0") as info:
        next(it)
    cause = info.value.__cause__
    assert isinstance(cause, KeyError)
    assert traceback.extract_tb(cause.__traceback__)[-1].line == "return {}[x]"
    shown = "".join(traceback.format_exception(info.value))
    assert shown.count("return {}[x]") == 1
    assert "The above exception was the direct cause of the following exception" in shown
