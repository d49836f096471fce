"""A backend whose actors cannot start (their CPUs held by an iterator left open) says what
it waits for and what holds it after ``START_NOTICE_S``, keeps waiting, and starts once the
CPUs are freed."""

import gc
import logging
import sys
import threading

import pytest
from tests.support.idle import wait_until

import gristmill as gm
from gristmill.ray import RayBackend

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("local_ray")  # 2 CPUs, and no other actors


def line_above():
    """``file:line`` of the line above the caller's."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno - 1}"


def first_of(it, got):
    try:
        got.append(next(it))
    except Exception as error:
        got.append(error)


def notices(caplog, backend):
    return [r.getMessage() for r in caplog.records if f"gristmill: {backend}" in r.getMessage()]


def test_a_backend_waiting_for_cpus_says_what_holds_them_then_starts_once_freed(
    monkeypatch, caplog
):
    from gristmill._src.ray import pool

    ds = gm.MapDataset.range(40).to_iter_dataset()
    # an iterator left open: its backend's 2 actors hold the cluster's 2 CPUs
    held = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2), backend=RayBackend(2)))
    held_at = line_above()
    waiting = RayBackend(num_actors=1)
    waiting_at = line_above()
    later = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=1), backend=waiting))
    later_at = line_above()
    got = []
    consumer = threading.Thread(target=first_of, args=(later, got), name="consumer")
    try:
        assert next(held) == 0
        assert wait_until(lambda: ray.available_resources().get("CPU", 0) == 0)
        monkeypatch.setattr(
            pool, "START_NOTICE_S", 0.0, raising=False
        )  # the notice at once: no timing
        with caplog.at_level(logging.WARNING, logger="gristmill.ray"):
            consumer.start()
            assert wait_until(lambda: notices(caplog, "RayBackend(num_actors=1"))
        [notice] = notices(caplog, "RayBackend(num_actors=1")
        assert got == []  # still waiting: the notice does not fail the stage
        # what waits and where it was made, for what, the cluster's CPUs
        assert notice.startswith(
            f"gristmill: RayBackend(num_actors=1, actor_options=None) (created at {waiting_at})"
            " has waited 0 s for 1 of its Ray actors to start (slot 0; 1 CPU each): the Ray "
            "cluster has 0 of 2 CPU free. "
        )
        # what holds them: the other backend, where it was made, and its open iterator
        assert (
            f"Held by RayBackend(num_actors=2, actor_options=None) (created at {held_at}): "
            f"2 actors of 1 CPU each, used by stage 'Range' set up at {held_at}, whose "
            "iterator is open (2 actors)." in notice
        )
        assert later_at not in notice  # the waiting stage's own actor holds nothing yet
        assert "Other Ray actors" not in notice
        assert notice.endswith(
            "To free them: close the iterators and pipelines that use those actors "
            "(iterator.close(), or a `with` block) and call shutdown() on their backend (or "
            "drop it); or give this backend fewer actors (num_actors) or smaller ones "
            "(actor_options={'num_cpus': 0.5}). It keeps waiting."
        )
        # closing the open iterator and dropping it (its backend with it) frees the CPUs
        held.close()
        held = None
        gc.collect()
        consumer.join(120)
        assert got == [0]
    finally:
        if held is not None:
            held.close()
        later.close()
        waiting.shutdown()
        consumer.join(120)
