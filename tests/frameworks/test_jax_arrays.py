"""gristmill.jax.to_global_arrays: local batches become global jax.Arrays for a Sharding.

One process with its one CPU device here; eight forced host devices and two cooperating JAX
processes (four devices each, Gloo collectives) in subprocesses, since the device count is
fixed when JAX starts.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gristmill as gm
from gristmill._src.core.extras import install_command

jax = pytest.importorskip("jax")
gjax = pytest.importorskip("gristmill.jax")


def batches(n=10, batch_size=2):
    def load(i):
        return {"x": np.full((3,), i, dtype=np.float32), "label": np.int32(i)}

    return gm.MapDataset.range(n).map(load).to_iter_dataset().batch(batch_size)


def one_device():
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def as_lists(element):
    return {k: np.asarray(v).tolist() for k, v in element.items()}


def test_every_array_becomes_a_jax_array_with_the_same_values_and_keys_in_order():
    out = list(gjax.to_global_arrays(batches(), one_device()))
    expected = list(batches())
    assert len(out) == len(expected) == 5
    for got, want in zip(out, expected, strict=True):
        assert list(got) == list(want) == ["label", "x"]  # jax's tree order, as batched
        assert all(isinstance(v, jax.Array) for v in got.values())
        assert got["x"].dtype == np.float32
        assert got["label"].dtype == np.int32
        assert as_lists(got) == as_lists(want)


def test_a_device_or_a_tree_of_shardings_is_accepted():
    device = jax.devices()[0]
    by_device = [as_lists(e) for e in gjax.to_global_arrays(batches(4), device)]
    tree = {"x": one_device(), "label": one_device()}
    by_tree = [as_lists(e) for e in gjax.to_global_arrays(batches(4), tree)]
    assert by_device == by_tree == [as_lists(e) for e in batches(4)]


@pytest.mark.parametrize(("cpu", "device"), [(0, 0), (1, 1), (4, 2)])
def test_a_state_taken_mid_way_restores_exactly(cpu, device):
    ds = gjax.to_global_arrays(
        batches(20), one_device(), cpu_buffer_size=cpu, device_buffer_size=device
    )
    with iter(ds) as it:
        head = [as_lists(next(it)) for _ in range(3)]
        state = it.get_state()
        rest = [as_lists(e) for e in it]
    with iter(ds) as resumed:
        resumed.set_state(state)
        assert [as_lists(e) for e in resumed] == rest
    assert head + rest == [as_lists(e) for e in batches(20)]


@pytest.mark.parametrize(
    "sharding", ["cpu", None, {"x": "cpu"}, 3], ids=["str", "None", "tree-of-str", "int"]
)
def test_a_sharding_of_the_wrong_kind_is_a_type_error_naming_it(sharding):
    with pytest.raises(TypeError, match=r"sharding must be a jax.sharding.Sharding"):
        gjax.to_global_arrays(batches(), sharding)


def test_a_map_dataset_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"ds must be a gristmill IterDataset.*to_iter_dataset"):
        gjax.to_global_arrays(gm.MapDataset.range(3), one_device())


@pytest.mark.parametrize("name", ["cpu_buffer_size", "device_buffer_size"])
def test_a_negative_buffer_size_is_rejected_by_name(name):
    with pytest.raises(ValueError, match=f"{name} must be >= 0, got -1"):
        gjax.to_global_arrays(batches(), one_device(), **{name: -1})


def test_gristmill_jax_without_jax_names_the_extra():
    code = (
        "import sys; sys.modules['jax'] = None\n"
        "try:\n    import gristmill.jax\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )
    assert install_command("jax") in out.stdout


def run_with_devices(code, devices, *args, timeout=120):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


_EIGHT_DEVICES = """
    import json
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import gristmill as gm, gristmill.jax as gjax

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data"))
    ds = gm.MapDataset.range(64).map(lambda i: np.arange(4) + 10 * i).to_iter_dataset()
    out = []
    for batch in gjax.to_global_arrays(ds.batch(16), sharding):
        rows = {s.device.id: s.data.shape[0] for s in batch.addressable_shards}
        out.append({"shape": list(batch.shape), "devices": len(batch.devices()),
                    "rows_per_device": sorted(set(rows.values())),
                    "sum": int(jax.jit(lambda a: a.sum())(batch)),
                    "values": np.asarray(batch).tolist()})
    print(json.dumps(out))
"""


def test_with_eight_devices_a_batch_is_split_along_the_data_axis():
    proc = run_with_devices(_EIGHT_DEVICES, 8)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout.splitlines()[-1])
    values = np.arange(4) + 10 * np.arange(64)[:, None]
    assert len(out) == 4
    for k, batch in enumerate(out):
        assert batch["shape"] == [16, 4]
        assert batch["devices"] == 8
        assert batch["rows_per_device"] == [4]  # 16 rows over the 4 data rows of the mesh
        assert batch["values"] == values[16 * k : 16 * (k + 1)].tolist()
        assert batch["sum"] == values[16 * k : 16 * (k + 1)].sum()


_ONE_OF_TWO_PROCESSES = """
    import json, sys
    index, port = int(sys.argv[1]), int(sys.argv[2])
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                               process_id=index, initialization_timeout=60)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import gristmill as gm, gristmill.jax as gjax

    shard = gm.sharding.ShardByJaxProcess(drop_remainder=True)
    ds = (gm.MapDataset.range(48).seed(3).shuffle()[shard.shard_index::shard.shard_count]
          .to_iter_dataset().batch(4, drop_remainder=True))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    local, merged = [], []
    for batch in gjax.to_global_arrays(ds, NamedSharding(mesh, P("data"))):
        assert batch.shape == (8,) and len(batch.addressable_shards) == 4
        local.append([int(s.data[0]) for s in batch.addressable_shards])
        merged.append(np.asarray(multihost_utils.process_allgather(batch, tiled=True)).tolist())
    print(json.dumps({"process": [jax.process_index(), jax.process_count()],
                      "devices": jax.device_count(), "local": local, "merged": merged}))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_feed_one_global_batch_each_its_own_shard():
    port = free_port()
    procs = [run_with_devices(_ONE_OF_TWO_PROCESSES, 4, i, port) for i in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.splitlines()[-1]))
    order = list(gm.MapDataset.range(48).seed(3).shuffle())
    shards = [order[0::2], order[1::2]]
    expected = [shards[0][4 * k : 4 * k + 4] + shards[1][4 * k : 4 * k + 4] for k in range(6)]
    for index, result in enumerate(results):
        assert result["process"] == [index, 2]
        assert result["devices"] == 8
        # the process's devices hold its own local batch, one row each
        assert result["local"] == [shards[index][4 * k : 4 * k + 4] for k in range(6)]
        # the global batch: process 0's rows, then process 1's
        assert result["merged"] == expected
