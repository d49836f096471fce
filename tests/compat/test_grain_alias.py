"""gristmill.compat.install_grain_alias: code that does ``import grain`` (a library wrapping
Grain) runs on gristmill unchanged (docs/grain_wrappers.md).

Each check runs in a child process: the test process imports the real Grain (the parity
tests' oracle), and the alias refuses to stand in for a Grain already imported.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))
from scripts import CHILD_TIMEOUT_S, python_output  # noqa: E402


def run_script(tmp_path, code, *args):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return python_output([str(script), *args], cwd=tmp_path)


ALIAS_NAMES = """
import importlib.util
import gristmill, gristmill.compat

real = importlib.util.find_spec("grain")  # the real Grain, installed beside gristmill
gristmill.compat.install_grain_alias()
gristmill.compat.install_grain_alias()  # again: nothing changes

import grain
import grain.python as pygrain
from grain import experimental
from grain._src.core import constants
from grain._src.core.sharding import even_split
from grain._src.python.data_loader import _determine_worker_count
from grain._src.python.dataset import dataset as dataset_base
from grain._src.python.dataset.transformations import source
from grain._src.python.ipc.shared_memory_array import SharedMemoryArrayMetadata

checks = {
    "real grain installed": real is not None and real.origin is not None,
    "grain.MapDataset": grain.MapDataset is gristmill.MapDataset,
    "grain.python.DataLoader": pygrain.DataLoader is gristmill.DataLoader,
    "grain.python.MapTransform": pygrain.MapTransform is gristmill.transforms.Map,
    "grain.experimental": experimental.ParquetIterDataset
    is gristmill.experimental.ParquetIterDataset,
    "grain.experimental attribute": grain.experimental is experimental,
    "grain.checkpoint": grain.checkpoint.CheckpointHandler
    is gristmill.checkpoint.CheckpointHandler,
    "grain._src.core.constants": constants.INDEX == gristmill.constants.INDEX,
    "even_split": even_split(10, grain.sharding.ShardOptions(1, 2)) == (5, 10),
    "_determine_worker_count": _determine_worker_count(3) == 3,
    "dataset.MapDataset": dataset_base.MapDataset is gristmill.MapDataset,
    "source.SourceMapDataset": type(grain.MapDataset.source([1])).__name__
    == source.SourceMapDataset.__name__,
    "shared_memory_array": SharedMemoryArrayMetadata
    is gristmill.multiprocessing.SharedMemoryArrayMetadata,
}
import io, os, tempfile
from grain._src.python.dataset.sources.tfrecord_dataset import (
    _TFRecordDatasetIterator,
    _TFRecordReader,
)

path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
gristmill.sources.write_tfrecord(path, [b"a", b"bc"])


class MemoryReader(_TFRecordReader):  # as MaxText's GCS reader: another file object
    def __init__(self, path):
        with open(path, "rb") as f:
            self._reader = io.BytesIO(f.read())


class MemoryIterator(_TFRecordDatasetIterator):
    def __init__(self, path):
        grain.DatasetIterator.__init__(self)
        self._reader = MemoryReader(path)


it = MemoryIterator(path)
first = [next(it), it.get_state()]
it.set_state({"reader_offset": 0})
checks["_TFRecordDatasetIterator"] = first + list(it) == [b"a", {"reader_offset": 17}, b"a", b"bc"]
try:
    import grain._src.no_such_module
except ModuleNotFoundError as e:
    checks["unknown module"] = "grain._src.no_such_module" in str(e)
try:
    grain.NoSuchName
except AttributeError as e:
    checks["unknown name"] = "grain.NoSuchName" in str(e)
print(json.dumps(checks))
"""


def test_the_alias_maps_grains_modules_and_the_paths_wrappers_import(tmp_path):
    checks = json.loads(run_script(tmp_path, "import json\n" + ALIAS_NAMES))
    assert checks == dict.fromkeys(checks, True)
    assert {"unknown module", "unknown name"} <= set(checks)


def test_the_alias_refuses_when_the_real_grain_is_already_imported(tmp_path):
    out = run_script(
        tmp_path,
        """
        import grain  # the real one
        import gristmill.compat
        try:
            gristmill.compat.install_grain_alias()
        except RuntimeError as e:
            print("refused:", e)
        """,
    )
    assert out.startswith("refused: the real Grain is already imported ('grain' from ")
    assert "install_grain_alias() first" in out


KERAS_NUMPY_PATH = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gristmill.compat
gristmill.compat.install_grain_alias()

import numpy as np
import grain
import keras_like_adapter as keras


def elements():
    return [{"x": np.full((2,), i, np.float32), "y": i, "z": np.float64(i / 2)} for i in range(10)]


def loader(workers):
    data = elements()
    sampler = grain.samplers.IndexSampler(
        len(data), shard_options=grain.sharding.NoSharding(), shuffle=True, seed=3, num_epochs=1
    )
    return grain.DataLoader(
        data_source=data,
        sampler=sampler,
        operations=[grain.transforms.Batch(4)],
        worker_count=workers,
        worker_buffer_size=2,
    )


def as_lists(batch):
    return {key: np.asarray(value).tolist() for key, value in batch.items()}


def leaves_are_arrays(batch):
    return all(isinstance(value, np.ndarray) for value in batch.values())


if __name__ == "__main__":
    inputs = {
        "MapDataset": grain.MapDataset.source(elements()).batch(4),
        "IterDataset": grain.MapDataset.source(elements()).to_iter_dataset().batch(4),
        "DataLoader": loader(0),
        "DataLoader with 2 workers": loader(2),
    }
    results = {}
    for name, ds in inputs.items():
        adapter = keras.GrainAdapter(ds)
        expected = [as_lists(batch) for batch in ds]
        converted = list(adapter.get_numpy_iterator())
        results[name] = {
            "recognised": keras.is_grain_dataset(ds),
            "batch_size": adapter.batch_size,
            "batches": len(expected),
            "same elements": [as_lists(batch) for batch in converted] == expected,
            "numpy leaves": all(leaves_are_arrays(batch) for batch in converted),
        }
    rebuilt = keras.GrainAdapter(inputs["DataLoader with 2 workers"]).get_numpy_iterator()
    results["rebuilt options"] = [
        rebuilt.multiprocessing_options.num_workers,
        rebuilt.multiprocessing_options.per_worker_buffer_size,
    ]
    print(json.dumps(results))
"""


def test_a_keras_like_adapter_runs_its_numpy_path_through_the_alias(tmp_path):
    results = json.loads(run_script(tmp_path, KERAS_NUMPY_PATH, str(HERE)))
    assert results.pop("rebuilt options") == [2, 2]
    for name, result in results.items():
        assert result == {
            "recognised": True,
            "batch_size": 4,
            "batches": 3,
            "same elements": True,
            "numpy leaves": True,
        }, name


WRAPPED_SCRIPT = """
import multiprocessing
import sys
import threading

import grain  # as a library wrapping Grain does
import numpy as np


class Scale(grain.transforms.Map):  # each worker runs this script again, importing grain
    def map(self, x):
        if grain_in_this_process() != "GrainAliasModule":
            raise RuntimeError(f"the worker's grain is not the alias: {sys.modules['grain']}")
        return x * 10


def grain_in_this_process():
    return type(sys.modules["grain"]).__name__


def main():
    # a thread of the script's own: forking is then unsafe, so gristmill's workers start
    # from its fork server
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    ds = grain.MapDataset.range(8).map(Scale()).to_iter_dataset().batch(2)
    with iter(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2))) as it:
        batches = [batch.tolist() for batch in it]
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # the script's own worker
        spawned = pool.apply(grain_in_this_process)
    stop.set()
    print(batches, grain.MapDataset.__module__, spawned, sys.argv[1:])


if __name__ == "__main__":
    main()
"""


def test_python_m_gristmill_compat_runs_a_script_and_its_workers_on_the_alias(tmp_path):
    (tmp_path / "train.py").write_text(WRAPPED_SCRIPT)
    out = python_output(["-m", "gristmill.compat", "train.py", "--epochs", "1"], cwd=tmp_path)
    assert out.startswith("[[0, 10], [20, 30], [40, 50], [60, 70]] ")
    assert out.split("]] ")[1].strip() == "gristmill GrainAliasModule ['--epochs', '1']"


def test_python_m_gristmill_compat_runs_a_module(tmp_path):
    (tmp_path / "entry.py").write_text(
        "import sys, grain\nprint(grain.MapDataset.__module__, __name__, sys.argv[1:])\n"
    )
    out = python_output(["-m", "gristmill.compat", "-m", "entry", "x"], cwd=tmp_path)
    assert out.split() == ["gristmill", "__main__", "['x']"]


def test_python_m_gristmill_compat_without_a_script_prints_its_usage():
    proc = subprocess.run(
        [sys.executable, "-m", "gristmill.compat"],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode != 0
    assert "usage: python -m gristmill.compat (script.py | -m module) [args...]" in proc.stderr
