"""Worker start-up: the start method, the user's main script's preloads, and the missing
``__main__`` guard.

The start method, when the user names none (:func:`fork_is_safe`): ``fork`` where it is
safe, as PyTorch's DataLoader does (a worker is running in ~10 ms and inherits every module
the script imported), else ``forkserver`` (``spawn`` where there is no forkserver). Fork is
used on Linux only, when no runtime known to break in a forked child is loaded (jax,
tensorflow, torch with CUDA initialised), and when every Python thread but the one forking
is the main thread or one of gristmill's own (no user thread that may hold a lock the child
would need). The pooled workers forked so are reused by later stages in any case.

With the forkserver and spawn start methods, each worker process runs the user's script
again (as ``__mp_main__``) before it runs any work. Two consequences are handled here:

- Cost. A script that imports torch or jax re-imports it in every worker (~1 s each).
  :func:`main_imports` names the modules the script imported, which the fork server then
  imports once (``worker_context``), so a worker's re-run of the script finds them
  imported. (CPython 3.11's own preload of ``__main__`` into the fork server never takes:
  it looks for a ``main_path`` key that its preparation data calls ``init_main_from_path``.)
- The guard. A script without ``if __name__ == "__main__":`` would start workers again
  while a worker imports it. :func:`check_guarded` (called wherever gristmill is about to
  start worker processes) refuses, in the parent and before any worker starts, a script
  whose main thread runs top-level code outside the guard: an
  :class:`UnguardedScriptError` naming the line and showing the fix. It does so whatever
  start method the workers would get in the end, so the outcome is a function of the script
  (fork or not depends on the threads that happen to run: a script that worked while
  workers were forked would fail once some library started a thread). Only a start method
  the user names as ``"fork"`` skips it: such workers never import the script. Where the
  parent cannot tell (the script's source cannot be read, or its workers start after its
  top-level code ended), a worker that finds itself importing the script and starting
  workers prints one line and exits with :data:`EXIT_CODE`
  (:func:`refuse_while_importing_main`), which :func:`error_for_exit` turns into the same
  error in the consumer.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import multiprocessing
import os
import sys
import threading
import types
from collections.abc import Iterator

EXIT_CODE = 87
"""A worker's exit status when it found the script's worker start-up unguarded."""

MESSAGE = (
    "gristmill: this worker process (start method {method}) is importing your script, whose "
    "top-level code starts worker processes again; it exits (the error in the main process "
    'names the fix: the `if __name__ == "__main__":` guard)'
)

_WHY_AND_FIX = (
    "A worker process started from a fork server or spawned (as gristmill starts them "
    "wherever forking is not safe: another thread running, jax loaded, not Linux) imports "
    "the script again and would run that code again, so the guard is needed whatever start "
    "method the workers would get. Move the code that builds and iterates the pipeline into "
    "a function called under the guard:\n\n"
    "    def main():\n"
    "        ...  # build and iterate the pipeline\n\n"
    '    if __name__ == "__main__":\n'
    "        main()\n"
)


class UnguardedScriptError(RuntimeError):
    """gristmill was asked to start worker processes from a script's top-level code outside
    its ``if __name__ == "__main__":`` block: an error of the script, not of an element (the
    engine names no element index on it)."""


def check_guarded(method: str) -> None:
    """Called before gristmill starts worker processes that may use start method ``method``
    (``"forkserver"`` for a stage that forks only where that is safe): in the parent,
    refuses a script that starts them from top-level code outside its ``__main__`` guard;
    in a worker importing the script, exits (:func:`refuse_while_importing_main`).

    Raises:
      UnguardedScriptError: ``method`` is not ``"fork"`` and the main thread runs the main
        script's top-level code outside an ``if __name__ == "__main__":`` block
        (:func:`unguarded_line`); the message names the line and shows the fix.
    """
    refuse_while_importing_main(method)
    if method == "fork":  # a forked worker does not import the script
        return
    where = unguarded_line()
    if where is not None:
        path, lineno = where
        line = linecache.getline(path, lineno).strip()
        shown = f" (line {lineno}: `{line}`)" if line else f" (line {lineno})"
        raise UnguardedScriptError(
            f"gristmill cannot start worker processes here: your script {path} starts them "
            f'from its top-level code{shown}, outside an `if __name__ == "__main__":` block. '
            + _WHY_AND_FIX
        )


def refuse_while_importing_main(method: str) -> None:
    """In a worker still importing the main module: print :data:`MESSAGE` (one line; the
    consumer's error says what to do), exit with :data:`EXIT_CODE`.

    Called (in the parent too, where it does nothing) before gristmill starts worker
    processes. ``_inheriting`` is what multiprocessing's own check reads.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stderr.write(MESSAGE.format(method=method) + "\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)


def error_for_exit(code: int | None) -> UnguardedScriptError | None:
    """The consumer's error for a worker that exited with ``code``, if it was the guard
    (where :func:`check_guarded` could not tell in the parent)."""
    if code != EXIT_CODE:
        return None
    return UnguardedScriptError(
        "gristmill cannot start worker processes: your script starts them from its top-level "
        'code, outside an `if __name__ == "__main__":` block. ' + _WHY_AND_FIX
    )


_starting = threading.Lock()


@contextlib.contextmanager
def nothing_to_import() -> Iterator[None]:
    """Around the start of a worker process from a fork server or by spawn: a main module
    whose ``__file__`` names no file (a script read from standard input, ``python -``, has
    ``"<stdin>"``) is hidden from multiprocessing meanwhile, which would have the worker run
    that path (and die: no such file). The worker then starts as under ``python -c``; the
    functions of ``__main__`` reach it by value. Starts are serialised here, so that no
    start sees another's hidden ``__file__`` come back half-way."""
    with _starting:
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        if (
            main is None
            or not isinstance(path, str)
            or getattr(main, "__spec__", None) is not None  # python -m: imported by name
            or os.path.isfile(path)
        ):
            yield
            return
        del main.__file__
        try:
            yield
        finally:
            main.__file__ = path


def unguarded_line() -> tuple[str, int] | None:
    """``(script path, line)`` where the main thread runs the main script's top-level code
    outside an ``if __name__ == "__main__":`` block now; None where it does not, or where
    there is no script to import again (``python -c``, standard input, a REPL, a notebook:
    no ``__main__.__file__``) or its source cannot be read."""
    main = sys.modules.get("__main__")
    if main is None or not isinstance(getattr(main, "__file__", None), str):
        return None
    namespace = vars(main)
    # the main thread's stack, whichever thread asks (a pipeline iterated in a thread the
    # script started at top level is unguarded too)
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals is namespace
    ):
        frame = frame.f_back
    if frame is None:  # the script's top-level code is not running (it ended)
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    source = "".join(linecache.getlines(filename, namespace))
    try:
        guarded = _guarded_lines(source)
    except (SyntaxError, ValueError):  # not the source that runs: cannot tell
        return None
    if not source or any(first <= lineno <= last for first, last in guarded):
        return None
    return filename, lineno


@functools.lru_cache(maxsize=8)
def _guarded_lines(source: str) -> tuple[tuple[int, int], ...]:
    """The line ranges of the bodies of ``source``'s ``if __name__ == "__main__":`` blocks."""
    ranges = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.lineno))
    return tuple(ranges)


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round), or requires it
    (``__name__ == "__main__" and ...``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_main_test(value) for value in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    return {_operand(test.left), _operand(test.comparators[0])} == {"__name__", "'__main__'"}


def _operand(node: ast.expr) -> str | None:
    """A name as itself, a string constant as its repr (so the two cannot be confused)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return repr(node.value)
    return None


_NOT_PRELOADED = frozenset({"__main__", "__mp_main__", "builtins"})


def main_imports() -> list[str]:
    """The modules the main script imported: those of its global modules, functions and
    classes (``import torch`` -> ``torch``; ``from sklearn.datasets import load_digits`` ->
    the module defining ``load_digits``), in the order the script names them."""
    main = sys.modules.get("__main__")
    if main is None:
        return []
    names: dict[str, None] = {}
    for value in list(vars(main).values()):
        name: object
        if isinstance(value, types.ModuleType):
            name = value.__name__
        elif isinstance(value, type | types.FunctionType | types.BuiltinFunctionType):
            name = getattr(value, "__module__", None)
        else:
            continue
        if isinstance(name, str) and name not in _NOT_PRELOADED and name in sys.modules:
            names[name] = None
    return list(names)


_FORK_UNSAFE_RUNTIMES = ("jax", "tensorflow")


def fork_is_safe() -> bool:
    """Whether a worker may be forked from this process now (see the module docstring)."""
    if not sys.platform.startswith("linux"):
        return False
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    if any(name in sys.modules for name in _FORK_UNSAFE_RUNTIMES):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and _cuda_initialized(torch):
        return False
    current, main = threading.current_thread(), threading.main_thread()
    return all(
        thread is current or thread is main or thread.name.startswith("gristmill")
        for thread in threading.enumerate()
    )


def _cuda_initialized(torch: types.ModuleType) -> bool:
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a partial or unusual torch: do not fork
        return True
