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
- The guard. A script without ``if __name__ == "__main__":`` starts workers again while a
  worker imports it; multiprocessing then fails in every worker with a long traceback, and
  the consumer sees workers die. :func:`refuse_while_importing_main` (called wherever
  gristmill starts worker processes) makes such a worker print one paragraph and exit with
  :data:`EXIT_CODE`; :func:`error_for_exit` turns that exit into one clear error in the
  consumer.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import types

EXIT_CODE = 87
"""A worker's exit status when it found the script's worker start-up unguarded."""

MESSAGE = (
    "gristmill: this worker process (start method {method}) is importing your script, whose "
    "top-level code starts worker processes again; it exits (the error in the main process "
    'names the fix: the `if __name__ == "__main__":` guard)'
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


def error_for_exit(code: int | None) -> RuntimeError | None:
    """The consumer's error for a worker that exited with ``code``, if it was the guard."""
    if code != EXIT_CODE:
        return None
    return RuntimeError(
        "worker processes could not start: your script starts gristmill's worker processes "
        "at import time, and each worker imports the script again. Put the code that builds "
        'and iterates the pipeline under `if __name__ == "__main__":` (for example '
        '`if __name__ == "__main__": main()`), as multiprocessing requires.'
    )


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
