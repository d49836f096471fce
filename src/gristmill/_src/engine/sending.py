"""What gristmill sends to a worker process (a pipeline, an op, an initializer): cloudpickled.

Grain sends pipelines to its workers with ``cloudpickle``, so users write lambdas and local
functions in pipelines that run in worker processes; gristmill does the same for the *work*
it sends: :func:`dumps` here, ``pickle.loads`` (:func:`loads`) in the worker. Importable
functions and classes still travel by reference; only what cannot be imported (a lambda, a
local function, a class defined in ``__main__``) travels by value.

A function sent by value keeps its code's file name (cloudpickle alone writes
``<dynamic-code>`` there): an error raised in it in a worker names the user's file and
line, and ``traceback`` shows the source line (:class:`_Pickler`).

The *data* (elements, results, inputs) keeps travelling as plain pickle 5 with large buffers
in shared memory (:mod:`shm`): it is produced per element, and cloudpickle's by-value
fallback would hide an element class the other side cannot import.
"""

from __future__ import annotations

import collections
import functools
import io
import marshal
import pickle
import types
from multiprocessing.reduction import ForkingPickler
from typing import Any, ClassVar

import cloudpickle


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, but a code object keeps its file name.

    cloudpickle replaces ``co_filename`` by ``"<dynamic-code>"`` (so that its pickles do not
    depend on where a function was defined): a worker's traceback then names no file and
    shows no source line. Here a code object travels as its ``marshal`` form, whole (file
    name, line table, nested code); the worker runs the same interpreter, which is what
    marshal's format needs (cloudpickle's own copies the version-specific bytecode too).
    """

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            try:
                return marshal.loads, (marshal.dumps(obj),)
            except ValueError:  # a constant marshal cannot write: cloudpickle's way
                return NotImplemented
        return super().reducer_override(obj)


def _dump(obj: Any, pickler: type[cloudpickle.Pickler]) -> bytes:
    buffer = io.BytesIO()
    pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for a worker process (cloudpickle: lambdas and local functions too;
    their code keeps its file name)."""
    return _dump(obj, _Pickler)


def loads(payload: bytes) -> Any:
    """The object :func:`dumps` pickled (cloudpickle output is read by plain pickle)."""
    return pickle.loads(payload)


def picklable_error(obj: Any) -> Exception | None:
    """The exception pickling ``obj`` for a worker raises, or None when it pickles."""
    try:
        dumps(obj)
    except Exception as error:
        return error
    return None


@functools.lru_cache(maxsize=32)
def _loaded(payload: bytes) -> Any:
    # An op sent with every call of a process pool is unpickled once per worker process.
    return loads(payload)


def _by_value(payload: bytes) -> ByValue:
    return ByValue(_loaded(payload), payload)


class ByValue:
    """A callable that pickles as its cloudpickle: lets a stdlib ``ProcessPoolExecutor``
    (which pickles with plain pickle) run a lambda or a local function.

    The cloudpickle is made once (the first time the callable is pickled) and unpickled once
    per worker process.
    """

    __slots__ = ("_fn", "_payload")

    def __init__(self, fn: Any, payload: bytes | None = None) -> None:
        self._fn = fn
        self._payload = payload

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        if self._payload is None:
            self._payload = dumps(self._fn)
        return _by_value, (self._payload,)

    def __repr__(self) -> str:
        return repr(self._fn)


class _InheritingPickler(_Pickler):
    """cloudpickle plus the reducers multiprocessing registers for its own pickler (pipes,
    sockets): while a process starts, objects made to be shared with a child (a
    ``multiprocessing.Value``, a lock, a queue) may be pickled, as with plain ``Process``
    arguments."""

    # ForkingPickler's registry has no public accessor; it holds the reducers of
    # multiprocessing.reduction.register (Connection, socket).
    dispatch_table: ClassVar[Any] = collections.ChainMap(
        ForkingPickler._extra_reducers,  # type: ignore[attr-defined]
        _Pickler.dispatch_table,
    )


class ForChild:
    """A ``Process`` argument that multiprocessing pickles with cloudpickle.

    The pickle is made while the process starts (so objects shared through inheritance
    travel, as plain arguments would) and unpickles in the child as the object itself; a
    forked child, where nothing is pickled, gets this wrapper: :func:`received` handles both.
    """

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return loads, (_dump(self.obj, _InheritingPickler),)


def received(arg: Any) -> Any:
    """The object a :class:`ForChild` argument carried (pickled or, forked, as it is)."""
    return arg.obj if isinstance(arg, ForChild) else arg
