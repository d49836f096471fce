"""Worker start-up and the user's script: workers are forked where that is safe (they
inherit what the script imported); otherwise the modules it imported are imported once by the
fork server (not again by every worker of every epoch), and a script without the
``__main__`` guard gets one clear error instead of every worker's traceback. A forked worker
still ends when its parent dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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
    return subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "PYTHONPATH": ":".join([str(tmp_path), *sys.path])},
    )


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


_UNGUARDED_SCRIPT = """
import threading
import gristmill as gm

threading.Thread(target=threading.Event().wait, name="user", daemon=True).start()  # no fork

options = gm.MultiprocessingOptions(num_workers=2)
ds = gm.MapDataset.range(64).map(lambda x: x + 1).to_iter_dataset().batch(8)
print(next(iter(ds.mp_prefetch(options))))
"""


@pytest.mark.slow
def test_an_unguarded_script_runs_where_workers_are_forked(tmp_path):
    script = _UNGUARDED_SCRIPT.replace("threading.Thread(", "# threading.Thread(")
    done = run_script(tmp_path, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[1", "2", "3", "4", "5", "6", "7", "8]"]


@pytest.mark.slow
def test_a_script_without_the_main_guard_gets_one_error_naming_it(tmp_path):
    done = run_script(tmp_path, _UNGUARDED_SCRIPT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()
    error = next(line for line in last if line.startswith("RuntimeError"))
    assert 'if __name__ == "__main__":' in error
    assert "worker processes could not start" in error
    assert "WorkerDiedError" not in done.stderr
    assert "bootstrapping phase" not in done.stderr  # multiprocessing's traceback is gone
    assert len(last) < 40, done.stderr


_UNGUARDED_SUBPROCESS_SCRIPT = """
from gristmill.pipeline import iterate_in_subprocess

def numbers():
    return iter(range(5))

print(list(iterate_in_subprocess(numbers)))
"""


@pytest.mark.slow
def test_an_unguarded_subprocess_iteration_gets_the_same_error(tmp_path):
    done = run_script(tmp_path, _UNGUARDED_SUBPROCESS_SCRIPT)
    assert done.returncode == 1
    assert 'if __name__ == "__main__":' in done.stderr
    assert "bootstrapping phase" not in done.stderr


_ORPHAN_SCRIPT = """
import os
import signal
import time

import gristmill as gm

if __name__ == "__main__":
    ds = gm.MapDataset.range(64).map(lambda x: os.getpid()).to_iter_dataset()
    it = iter(ds.mp_prefetch(gm.MultiprocessingOptions(num_workers=2)))
    workers = {next(it) for _ in range(16)}
    with open("workers.txt", "w") as out:
        out.write(" ".join(map(str, workers)))
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
