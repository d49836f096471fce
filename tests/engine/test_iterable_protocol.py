"""A streamed iterable's worker (``iterate_in_subprocess``, Grain's process prefetch) and its
parent speak typed commands and messages: every command decodes to itself, and bytes that
are not a command end the worker's job with a failure naming them — never read as some
other command, never silently dropped."""

import functools
import multiprocessing
import pickle
from multiprocessing.connection import wait

import pytest

from gristmill._src.engine import messages, sending, shm, worker_pool
from gristmill._src.engine.iterable_job import run_iterable
from gristmill._src.engine.iterable_protocol import (
    Abandon,
    Credit,
    EndWorker,
    Failed,
    Item,
    Iterate,
    PassEnd,
    Phase,
    ProtocolError,
    Ready,
    Stop,
    Stopped,
    Tag,
    decode_command,
    decode_message,
    encode_command,
    encode_message,
)
from gristmill._src.engine.transport import job_message, pooled_worker_main, worker_context

pytestmark = pytest.mark.usefixtures("no_children_left")

_REPLY_S = 60.0  # a bound for a hang, not a timing claim


@pytest.mark.parametrize(
    "command",
    [
        Credit(),
        Stop(),
        Iterate(1),
        Iterate(12, ("index", 7)),
        Iterate(3, {"parent": {"next_index": 4}}),
        Abandon(0),
        Abandon(40),
    ],
)
def test_every_command_decodes_to_itself(command):
    assert decode_command(encode_command(command)) == command


def test_the_pools_order_to_end_a_worker_is_a_command_of_its_own():
    # worker_pool.stop sends messages.STOP (conn.send): a job reading it must end, not
    # misread it
    parent, child = multiprocessing.Pipe()
    with parent, child:
        parent.send(messages.STOP)
        assert decode_command(child.recv_bytes()) == EndWorker()


def test_what_is_not_a_command_is_refused_when_sent():
    with pytest.raises(TypeError, match=r"must be a Credit, Iterate, Abandon or Stop, got 'c'"):
        encode_command("c")  # the one-letter command of the old protocol


@pytest.mark.parametrize(
    "message",
    [
        Ready(),
        Item(2, {"value": [1, 2]}),
        Item(1, None),
        PassEnd(3),
        Failed.of(1, Phase.FETCHING, ValueError("element 5")),
        Failed.of(0, Phase.INITIALIZER, KeyError("x"), detail="setup"),
        Stopped(reusable=True),
    ],
)
def test_every_message_decodes_to_itself_and_carries_no_class_by_name(message):
    wire = encode_message(message)
    assert type(wire[0]) is int  # a plain int on the wire: no class to look up per item
    decoded = decode_message(pickle.loads(pickle.dumps(wire)))
    assert type(decoded) is type(message)
    assert decoded[:4] == message[:4]


@pytest.mark.parametrize("wire", [("item", 1, 2), (2, 1), (), None, (9, 0)])
def test_what_is_not_a_message_is_refused_naming_it(wire):
    with pytest.raises(ProtocolError, match=r"not a message of a streamed iterable's worker: "):
        decode_message(wire)


def _reply(worker):
    """The worker's next message (bounded: a worker that says nothing fails the test)."""
    ready = wait([worker.conn, worker.process.sentinel], _REPLY_S)
    assert worker.conn in ready, "the worker sent nothing"
    assert worker.conn.poll(), "the worker ended without a word"
    return decode_message(shm.loads(worker.conn.recv_bytes()))


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"q", "an unknown command b'q'"),
        (bytes([Tag.ITERATE]) + b"2x", "a malformed command b'\\x022x'"),
        (bytes([Tag.ABANDON]), "a malformed command b'\\x03'"),
        (b"\x80\x05\x95junk", "an unknown command"),
    ],
)
def test_a_worker_sent_bytes_that_are_not_a_command_names_them_and_ends_its_job(raw, says):
    [worker] = worker_pool.lease(worker_context(None), 1, pooled_worker_main, daemon=True)
    try:
        work = sending.dumps((functools.partial(range, 3), []))
        worker.conn.send(job_message(run_iterable, work, 2, None))
        assert _reply(worker) == Ready()
        worker.conn.send_bytes(raw)
        failed = _reply(worker)
        assert isinstance(failed, Failed)
        assert failed.phase is Phase.COMMAND
        assert failed.type_name == ProtocolError.__name__
        assert says in failed.text
        # the job is over and the worker ends with it (it is never pooled again)
        worker.process.join(_REPLY_S)
        assert worker.process.exitcode == 0
    finally:
        worker_pool.stop(worker, ask=False)
