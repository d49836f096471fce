"""Worker start-up and the user's script: the modules it imported are imported once by the
fork server (not again by every worker of every epoch), and a script without the
``__main__`` guard gets one clear error instead of every worker's traceback."""

import subprocess
import sys
import textwrap

import pytest

# A module with a visible import: each process that imports it appends its pid to a file.
_NOISY_MODULE = """
import os
with open(os.environ["IMPORT_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
"""

_EPOCHS_SCRIPT = """
import noisy_module  # what a training script imports (torch, jax, ...)
import gristmill as gm


def main():
    ds = gm.MapDataset.range(64).map(lambda x: x + 1)
    for _ in range(3):  # one iterator per epoch: new workers each time
        options = gm.MultiprocessingOptions(num_workers=2)
        with iter(ds.to_iter_dataset().batch(8).mp_prefetch(options)) as it:
            assert sum(len(b) for b in it) == 64


if __name__ == "__main__":
    main()
"""


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
def test_the_scripts_imports_are_imported_once_by_the_fork_server_not_per_worker(tmp_path):
    (tmp_path / "noisy_module.py").write_text(_NOISY_MODULE)
    log = tmp_path / "imports.log"
    done = run_script(tmp_path, _EPOCHS_SCRIPT, IMPORT_LOG=str(log))
    assert done.returncode == 0, done.stderr
    pids = log.read_text().split()
    # the script itself and the fork server; not each of the 6 workers of the 3 epochs
    assert len(pids) == 2, pids


_UNGUARDED_SCRIPT = """
import gristmill as gm

options = gm.MultiprocessingOptions(num_workers=2)
ds = gm.MapDataset.range(64).map(lambda x: x + 1).to_iter_dataset().batch(8)
print(next(iter(ds.mp_prefetch(options))))
"""


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
