"""States too deep or with integers too long to convert: a ValueError that names the file (or
the state bytes, or the state), says what is wrong and the limit — never a RecursionError or
Python's int-conversion error that names nothing (issue 33)."""

from __future__ import annotations

import asyncio
import importlib.util
import re

import pytest

import gristmill as gm
from gristmill.checkpoint import CheckpointHandler

M = gm.MapDataset
LEVELS = 100_000
LIMIT = "more than 500 levels of lists and dicts"
DEEP = {
    "array": "[" * LEVELS + "]" * LEVELS,
    "object": '{"parent": ' * LEVELS + "{}" + "}" * LEVELS,
    "in-a-state": '{"next_index": 1, "x": ' + "[" * LEVELS + "]" * LEVELS + "}",
}
LONG_INTEGER = '{"next_index": ' + "7" * 1_000_000 + "}"
LONG_INTEGER_NESTED = '{"parent": {"parent": {"next_index": -' + "7" * 1_000_000 + "}}}"


def pipeline():
    return M.range(6).to_iter_dataset()


def loader():
    return gm.DataLoader(
        data_source=list(range(8)), sampler=gm.samplers.SequentialSampler(8), worker_count=0
    )


def deep_dict():
    state = {"next_index": 1}
    for _ in range(LEVELS):
        state = {"parent": state}
    return state


def restorers():
    """Every public way to restore a state file: (name, restore(directory))."""
    return {
        "handler": lambda d: CheckpointHandler().restore(d, iter(pipeline())),
        "handler-dataloader": lambda d: CheckpointHandler().restore(d, iter(loader())),
        "iterator-load": lambda d: asyncio.run(iter(pipeline()).load(d)),
        "dataloader-load": lambda d: asyncio.run(iter(loader()).load(d)),
    }


@pytest.mark.parametrize("how", list(restorers()))
@pytest.mark.parametrize("content", list(DEEP))
def test_a_too_deep_checkpoint_file_is_a_value_error_naming_it(tmp_path, content, how):
    (tmp_path / "process_0-of-1.json").write_text(DEEP[content])
    pattern = rf"the checkpoint '.*process_0-of-1.json' is too deeply nested: {LIMIT}"
    with pytest.raises(ValueError, match=pattern):
        restorers()[how](tmp_path)


@pytest.mark.parametrize("how", list(restorers()))
@pytest.mark.parametrize(
    ("content", "field"),
    [(LONG_INTEGER, "['next_index']"), (LONG_INTEGER_NESTED, "['parent']['parent']['next_index']")],
    ids=["top", "nested"],
)
def test_an_integer_too_long_in_a_checkpoint_file_names_the_file_and_field(
    tmp_path, content, field, how
):
    (tmp_path / "process_0-of-1.json").write_text(content)
    pattern = (
        r"the checkpoint '.*process_0-of-1.json' holds an integer of 1000000 digits in the "
        rf"field {re.escape(field)}; Python converts at most \d+"
    )
    with pytest.raises(ValueError, match=pattern):
        restorers()[how](tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("orbax") is None, reason="needs the orbax extra")
def test_a_too_deep_state_through_orbax_is_a_value_error_naming_the_file(tmp_path):
    import orbax.checkpoint as ocp

    it = iter(pipeline())
    with ocp.CheckpointManager(tmp_path) as manager:
        manager.save(1, args=ocp.args.Composite(data=gm.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
    (state_file,) = tmp_path.glob("1/data/process_0-of-1.json")
    state_file.write_text(DEEP["object"])
    restore = gm.checkpoint.CheckpointRestore(iter(pipeline()))
    with ocp.CheckpointManager(tmp_path) as manager:
        pattern = rf"process_0-of-1.json' is too deeply nested: {LIMIT}"
        with pytest.raises(ValueError, match=pattern):
            manager.restore(1, args=ocp.args.Composite(data=restore))


@pytest.mark.parametrize("content", list(DEEP))
def test_too_deep_dataloader_state_bytes_are_a_value_error(content):
    with pytest.raises(
        ValueError, match=rf"the DataLoader state \(JSON bytes\) is too deeply nested: {LIMIT}"
    ):
        iter(loader()).set_state(DEEP[content].encode())


def test_an_integer_too_long_in_dataloader_state_bytes_names_the_field():
    state = LONG_INTEGER.replace("next_index", "version").encode()
    with pytest.raises(
        ValueError,
        match=r"the DataLoader state \(JSON bytes\) holds an integer of 1000000 digits in the "
        r"field \['version'\]",
    ):
        iter(loader()).set_state(state)


def _spdl_pipeline():
    from gristmill.pipeline import PipelineBuilder

    return PipelineBuilder().add_source(range(5)).add_sink(2).build(num_threads=1)


def _torch_loader():
    torch = pytest.importorskip("torch")
    del torch
    from gristmill.torch import TorchLoader

    return TorchLoader(M.range(8).batch(4))


DICT_RESTORERS = {
    "iterator": lambda s: iter(pipeline()).set_state(s),
    "iterator-batched": lambda s: iter(pipeline().batch(2)).set_state(s),
    "elastic": lambda s: gm.experimental.ElasticIterator(
        M.range(20), 4, gm.sharding.NoSharding()
    ).set_state(s),
    "spdl-pipeline": lambda s: _spdl_pipeline().set_state(s),
    "torch-loader": lambda s: _torch_loader().load_state_dict(s),
    "epochs": lambda s: gm.training.Epochs(
        M.range(8), lambda epoch: epoch.to_iter_dataset(), num_epochs=2
    ).set_state(s),
}


@pytest.mark.parametrize("how", list(DICT_RESTORERS))
def test_a_too_deep_state_dict_is_a_value_error(how):
    with pytest.raises(ValueError, match=rf"the state is too deeply nested: {LIMIT}"):
        DICT_RESTORERS[how](deep_dict())


def test_accept_changes_of_a_too_deep_state_is_a_value_error():
    with pytest.raises(ValueError, match=rf"the state is too deeply nested: {LIMIT}"):
        gm.checkpoint.accept_changes(deep_dict())


@pytest.mark.parametrize("how", [h for h in DICT_RESTORERS if h != "torch-loader"])
def test_an_integer_too_long_to_print_in_a_state_dict_names_the_field(how):
    state = {"next_index": 1, "parent": {"next_index": 10**5000}}
    with pytest.raises(
        ValueError,
        match=r"the state holds an integer of about 5001 digits in the field "
        r"\['parent'\]\['next_index'\]; Python converts at most",
    ):
        DICT_RESTORERS[how](state)


def test_a_state_that_holds_itself_is_a_value_error():
    state = {"next_index": 1}
    state["parent"] = state
    with pytest.raises(ValueError, match=rf"the state is too deeply nested: {LIMIT}"):
        iter(pipeline()).set_state(state)


def test_states_of_real_pipelines_still_restore(tmp_path):
    it = iter(pipeline().batch(2))
    next(it)
    CheckpointHandler().save(tmp_path, it)
    assert [
        b.tolist() for b in CheckpointHandler().restore(tmp_path, iter(pipeline().batch(2)))
    ] == [
        [2, 3],
        [4, 5],
    ]
    li = iter(loader())
    next(li)
    fresh = iter(loader())
    fresh.set_state(li.get_state())
    assert list(fresh) == list(range(1, 8))
