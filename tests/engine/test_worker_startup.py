"""Worker start-up and the user's script: workers are forked where that is safe (they
inherit what the script imported); otherwise the modules it imported are imported once by the
fork server (not again by every worker of every epoch), and a script that starts workers
outside the ``__main__`` guard gets one clear error before any worker starts, whether they
would be forked or not. A forked worker still ends when its parent dies."""

import os
import py_compile
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parents[1] / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
from scripts import run_python  # noqa: E402

# A module with a visible import: each process that imports it appends its pid to a file.
_NOISY_MODULE = """
import os
with open(os.environ["IMPORT_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
"""

_EPOCHS_SCRIPT = """
import os
import sys
import threading
import types

import noisy_module  # what a training script imports (torch, jax, ...)
import gristmill as gm

PRELUDE


def main():
    ds = gm.MapDataset.range(64).map(lambda x: os.getppid())
    parents = set()
    for _ in range(3):  # one iterator per epoch
        options = gm.MultiprocessingOptions(num_workers=2)
        with iter(ds.to_iter_dataset().batch(8).mp_prefetch(options)) as it:
            batches = list(it)
            assert sum(len(b) for b in batches) == 64
            parents.update(int(p) for b in batches for p in b)
    print("forked" if parents == {os.getpid()} else "fork server")


if __name__ == "__main__":
    main()
"""

# what makes fork unsafe: a thread of the user's that may hold a lock the child needs, or a
# runtime that breaks in a forked child (a stand-in module: only its name is checked)
_USER_THREAD = 'threading.Thread(target=threading.Event().wait, name="user", daemon=True).start()'
_JAX_LOADED = 'sys.modules["jax"] = types.ModuleType("jax")'


def run_script(tmp_path, script, **env):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return run_python([path], tmp_path, **env)


@pytest.mark.slow
def test_workers_are_forked_where_safe_and_inherit_the_scripts_imports(tmp_path):
    (tmp_path / "noisy_module.py").write_text(_NOISY_MODULE)
    log = tmp_path / "imports.log"
    done = run_script(tmp_path, _EPOCHS_SCRIPT.replace("PRELUDE", ""), IMPORT_LOG=str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["forked"]
    assert len(log.read_text().split()) == 1  # the script alone: workers inherit it


@pytest.mark.slow
@pytest.mark.parametrize("unsafe", [_USER_THREAD, _JAX_LOADED], ids=["user-thread", "jax"])
def test_where_fork_is_unsafe_the_fork_server_imports_the_scripts_imports_once(tmp_path, unsafe):
    (tmp_path / "noisy_module.py").write_text(_NOISY_MODULE)
    log = tmp_path / "imports.log"
    done = run_script(tmp_path, _EPOCHS_SCRIPT.replace("PRELUDE", unsafe), IMPORT_LOG=str(log))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fork", "server"]
    pids = log.read_text().split()
    # the script itself and the fork server; not each of the 6 workers of the 3 epochs
    assert len(pids) == 2, pids


# A script that starts workers from its top-level code (no `if __name__ == "__main__":`),
# through each kind of process stage; PRELUDE may start a thread of the user's first (which
# is what made gristmill fork its workers or not). At exit it reports the child processes
# it still has (none were started).
_UNGUARDED_SCRIPT = """
import atexit
import os
import threading

import gristmill as gm
from gristmill.pipeline import PipelineBuilder, iterate_in_subprocess
from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig


def children():
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(entry)
    return found


atexit.register(lambda: print("children left:", len(children())))
PRELUDE


def numbers():
    return iter(range(5))


STAGE
"""

_UNGUARDED_STAGES = {
    "mp_prefetch": (
        "ds = gm.MapDataset.range(64).map(lambda x: x + 1).to_iter_dataset().batch(8)\n"
        "print(next(iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))))"
    ),
    "iterate_in_subprocess": "print(list(iterate_in_subprocess(numbers)))",
    "to_region": (
        "builder = PipelineBuilder().add_source(range(4))\n"
        "builder.to(ProcessPoolExecutorConfig(max_workers=2)).pipe(abs).to(MAIN_PROCESS)\n"
        "pipeline = builder.add_sink(3).build(num_threads=1)\n"
        "with pipeline.auto_stop():\n"
        "    print(sorted(pipeline))"
    ),
}


def unguarded(stage, prelude=""):
    script = _UNGUARDED_SCRIPT.replace("PRELUDE", prelude)
    return script.replace("STAGE", _UNGUARDED_STAGES[stage])


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(_UNGUARDED_STAGES))
def test_an_unguarded_script_fails_the_same_way_with_or_without_a_thread(tmp_path, stage):
    # A thread of the user's (or of a library's) used to decide whether workers were
    # forked, and so whether the unguarded script worked: now the script alone decides.
    runs = [run_script(tmp_path, unguarded(stage, prelude)) for prelude in ("", _USER_THREAD)]
    for done in runs:
        assert done.returncode == 1, done.stderr
        assert done.stdout.split() == ["children", "left:", "0"]  # no worker was started
        message = done.stderr[done.stderr.index("UnguardedScriptError: ") :]
        assert message.startswith(
            "UnguardedScriptError: gristmill cannot start worker processes here: your script "
            f"{tmp_path / 'script.py'} starts them from its top-level code (line "
        ), done.stderr
        assert 'if __name__ == "__main__":\n        main()' in message
        assert "at element index" not in done.stderr  # no element is to blame
        assert "WorkerDiedError" not in done.stderr
        assert "bootstrapping phase" not in done.stderr  # multiprocessing's traceback
    assert runs[0].stderr == runs[1].stderr


@pytest.mark.slow
def test_where_the_scripts_source_cannot_be_read_the_workers_give_the_same_error(tmp_path):
    # python script.pyc with the .py gone: the parent cannot tell the guard is missing; a
    # worker importing the script finds itself starting workers and exits, and the
    # consumer's error is the same guard error, which blames no element
    source = tmp_path / "source.py"
    source.write_text(textwrap.dedent(unguarded("mp_prefetch", _USER_THREAD)))
    compiled = tmp_path / "script.pyc"
    py_compile.compile(str(source), cfile=str(compiled), doraise=True)
    source.unlink()
    done = run_python([compiled], tmp_path)
    assert done.returncode == 1, done.stderr
    message = done.stderr[done.stderr.index("UnguardedScriptError: ") :]
    assert message.startswith(
        "UnguardedScriptError: gristmill cannot start worker processes: your script starts "
        "them from its top-level code"
    ), done.stderr
    assert "at element index" not in done.stderr


_GUARDED_FORMS = {
    "reversed": 'if "__main__" == __name__:',
    "and": 'if __name__ == "__main__" and len(sys.argv) >= 1:',
}


@pytest.mark.slow
@pytest.mark.parametrize("guard", sorted(_GUARDED_FORMS))
def test_the_guard_written_another_way_is_recognised(tmp_path, guard):
    # with a user thread, the workers come from the fork server and import the script again
    stage = textwrap.indent(_UNGUARDED_STAGES["mp_prefetch"], "    ")
    script = unguarded("mp_prefetch", _USER_THREAD).replace(
        _UNGUARDED_STAGES["mp_prefetch"], f"import sys\n{_GUARDED_FORMS[guard]}\n{stage}"
    )
    done = run_script(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[1 2 3 4 5 6 7 8]"


_FORKED_ON_REQUEST = """
from gristmill.pipeline import iterate_in_subprocess

def numbers():
    return iter(range(5))

print(list(iterate_in_subprocess(numbers, mp_context="fork")))
"""


@pytest.mark.slow
def test_an_unguarded_script_may_ask_for_forked_workers_which_never_import_it(tmp_path):
    done = run_script(tmp_path, _FORKED_ON_REQUEST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[0,", "1,", "2,", "3,", "4]"]


_INTERACTIVE = """
import threading
import gristmill as gm
from gristmill.pipeline import PipelineBuilder, iterate_in_subprocess
from gristmill.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig
PRELUDE


def triple(x):
    return x * 3


class Double(gm.transforms.Map):
    def map(self, x):
        return x * 2


ds = gm.MapDataset.range(8).map(lambda x: x * 3).to_iter_dataset()
print(list(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2))))
sampler = gm.samplers.IndexSampler(6, shard_options=gm.sharding.NoSharding(), num_epochs=1)
loader = gm.DataLoader(data_source=range(6), sampler=sampler, operations=[Double()], worker_count=2)
print(list(loader))
builder = PipelineBuilder().add_source(range(4))
builder.to(ProcessPoolExecutorConfig(max_workers=2)).pipe(triple).to(MAIN_PROCESS)
pipeline = builder.add_sink(4).build(num_threads=1)
with pipeline.auto_stop():
    print(sorted(pipeline))
print(list(iterate_in_subprocess(lambda: range(3))))
"""
_INTERACTIVE_OUTPUT = [
    "[0, 3, 6, 9, 12, 15, 18, 21]",
    "[0, 2, 4, 6, 8, 10]",
    "[0, 3, 6, 9]",
    "[0, 1, 2]",
]
# how the code reaches python: (arguments, standard input)
_HOW = {
    "-c": lambda code: (["-c", code], None),  # python -c CODE
    "stdin": lambda code: (["-"], code),  # python - < train.py
    "piped": lambda code: ([], code),  # cat train.py | python; a heredoc in a job file
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(_HOW))
@pytest.mark.parametrize("prelude", ["", _USER_THREAD], ids=["no-thread", "user-thread"])
def test_interactive_code_starts_workers_with_or_without_a_thread(tmp_path, how, prelude):
    # no script file for the workers to import: python -c, or a script read from stdin
    # (whose __file__ is "<stdin>", which a worker started from the fork server or spawned
    # used to try to run: FileNotFoundError); with a thread of the user's running, workers
    # are not forked. Every backend that starts worker processes.
    code = textwrap.dedent(_INTERACTIVE.replace("PRELUDE", prelude))
    args, stdin = _HOW[how](code)
    done = run_python(args, tmp_path, stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == _INTERACTIVE_OUTPUT


_ORPHAN_SCRIPT = """
import os
import signal
import time

import gristmill as gm

if __name__ == "__main__":
    ds = gm.MapDataset.range(64).map(lambda x: os.getpid()).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    next(it)
    # The workers are this process's children (forked); which of them produced the first
    # elements depends on timing, so they are read from /proc, not from the elements.
    workers = []
    for thread in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{thread}/children") as children:
            workers += children.read().split()
    with open("workers.txt", "w") as out:
        out.write(" ".join(workers))
    if os.fork() == 0:  # a child of the user's that outlives the script
        time.sleep(60)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_forked_workers_end_when_the_script_is_killed(tmp_path):
    # The user's later child inherits the pipes to the workers; it must not keep them open
    # (a worker sees its parent gone as end-of-file on its pipe).
    path = tmp_path / "script.py"
    path.write_text(_ORPHAN_SCRIPT)
    env = {"PYTHONPATH": ":".join(sys.path)}
    script = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=env)
    try:
        assert script.wait(timeout=120) == -signal.SIGKILL
        workers = [int(pid) for pid in (tmp_path / "workers.txt").read_text().split()]
        assert len(workers) == 2
        deadline = time.monotonic() + 10
        alive = workers
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in workers if _alive(pid)]
        assert alive == []
    finally:
        for pid in _children_of_nobody_named(path):
            os.kill(pid, signal.SIGKILL)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _children_of_nobody_named(script):
    """The processes still running ``script`` (the user's sleeping child; leftover workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if str(script).encode() in cmdline.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids
