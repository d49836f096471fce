"""RayBackend on a simulated 2-node cluster: a node removed mid-epoch changes nothing."""

import time

import pytest

import gristmill as gm
from gristmill.ray import RayBackend

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")


@pytest.fixture(scope="module")
def cluster():
    two_nodes = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    worker = two_nodes.add_node(num_cpus=2)
    ray.init(address=two_nodes.address, log_to_driver=False, configure_logging=False)
    two_nodes.wait_for_nodes()
    yield two_nodes, worker
    ray.shutdown()
    two_nodes.shutdown()


def slow_double(x):
    time.sleep(0.002)
    return 2 * x


def node_of(actor_name):
    return ray.get(ray.get_actor(actor_name).node.remote())


def test_a_node_removed_mid_epoch_still_delivers_every_element_once_in_order(cluster):
    from .conftest import pool_actor_names

    two_nodes, worker = cluster
    # one actor per node (SPREAD), so removing the worker node kills one
    backend = RayBackend(num_actors=2, actor_options={"scheduling_strategy": "SPREAD"})
    ds = gm.MapDataset.range(600).map(slow_double).to_iter_dataset()
    it = iter(ds.mp_prefetch(backend=backend))
    try:
        got = [next(it) for _ in range(60)]
        nodes = {node_of(name) for name in pool_actor_names()}
        assert worker.node_id in nodes
        two_nodes.remove_node(worker)
        got += list(it)
    finally:
        it.close()
        backend.shutdown()
    assert got == [2 * x for x in range(600)]
