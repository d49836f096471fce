"""The training examples resume exactly: SIGKILLed mid-epoch and restarted with another
worker count, every step's loss is bit for bit the uninterrupted run's.

Each example (examples/train_torch.py, examples/train_jax.py) runs straight through with 2
workers; then again, SIGKILLed in its second epoch once the checkpoint there is finished
(half an interval on, at a step that is not a checkpoint step; the JAX example is then
usually writing the next checkpoint in the background, which the restart must not take),
and restarted with 1 worker from its last finished checkpoint.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EPOCHS = 3
EVERY = 20
STEPS_PER_EPOCH = 1437 // 32  # the 80% training split of the 1797 digits, full batches
TOTAL = EPOCHS * STEPS_PER_EPOCH
# The first checkpoint of the second epoch, and half an interval after it (mid-epoch).
SECOND_EPOCH_CHECKPOINT = (STEPS_PER_EPOCH // EVERY + 1) * EVERY
KILL_AFTER = SECOND_EPOCH_CHECKPOINT + EVERY // 2
RUN_TIMEOUT_S = 100
REQUIRES = {
    "train_torch.py": ("torch", "sklearn"),
    "train_jax.py": ("jax", "orbax.checkpoint", "sklearn"),
}
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def checkpoint_finished(script, directory, step):
    """Whether the example's checkpoint of ``step`` is complete on disk. The torch example
    saves synchronously (before the next step's loss is logged); Orbax saves in the
    background and renames the step's temporary directory to ``<step>`` when it is done."""
    if script == "train_jax.py":
        return (directory / str(step)).is_dir()
    return True


def command(script, directory, log, workers):
    return [
        sys.executable,
        str(EXAMPLES / script),
        f"--workers={workers}",
        f"--epochs={EPOCHS}",
        f"--checkpoint-dir={directory}",
        f"--checkpoint-every={EVERY}",
        f"--loss-log={log}",
    ]


def run(script, directory, log, workers):
    result = subprocess.run(
        command(script, directory, log, workers),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=ENV,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def read_log(path):
    """{step: loss hex} of a loss log; each step once."""
    steps = [line.split() for line in path.read_text().splitlines()]
    losses = {int(step): loss for step, loss in steps}
    assert len(losses) == len(steps), f"a step logged twice in {path}"
    return losses


def logged_steps(path):
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    complete = [line for line in lines if len(line.split()) == 2]
    return int(complete[-1].split()[0]) if complete else 0


def ready_to_kill(script, directory, log, after, checkpoint):
    """The log shows step ``after`` or later, not a checkpoint step (the kill lands between
    two), and the checkpoint of step ``checkpoint`` is finished."""
    step = logged_steps(log)
    if step < after or step % EVERY == 0:
        return False
    return checkpoint_finished(script, directory, checkpoint)


def run_and_kill(script, directory, log, workers, after, checkpoint):
    """Starts the example, SIGKILLs it once ``ready_to_kill``; its stderr text. Its worker
    processes must then go (nothing left in its process group)."""
    process = subprocess.Popen(
        command(script, directory, log, workers),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
        start_new_session=True,
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not ready_to_kill(script, directory, log, after, checkpoint):
            assert process.poll() is None, "the example ended before it was killed"
            assert time.monotonic() < deadline, f"no step {after} in {RUN_TIMEOUT_S} s"
            time.sleep(0.001)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        assert_process_group_ends(process.pid)
        return process.stderr.read().decode(errors="replace")
    finally:
        with_leftovers_killed(process)


def assert_process_group_ends(pgid, timeout_s=15):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "workers outlived the killed training process"
        time.sleep(0.05)


def with_leftovers_killed(process):
    if process.poll() is None:
        process.kill()
        process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.stderr.close()


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(REQUIRES))
def test_sigkill_mid_epoch_then_resume_under_another_worker_count_logs_the_same_losses(
    script, tmp_path
):
    for module in REQUIRES[script]:
        pytest.importorskip(module)
    straight_log = tmp_path / "straight.log"
    run(script, tmp_path / "straight", straight_log, workers=2)
    straight = read_log(straight_log)
    assert sorted(straight) == list(range(1, TOTAL + 1))

    directory = tmp_path / "interrupted"
    killed_log, resumed_log = tmp_path / "killed.log", tmp_path / "resumed.log"
    stderr = run_and_kill(
        script,
        directory,
        killed_log,
        workers=2,
        after=KILL_AFTER,
        checkpoint=SECOND_EPOCH_CHECKPOINT,
    )
    killed = read_log(killed_log)
    last_killed = max(killed)
    assert sorted(killed) == list(range(1, last_killed + 1))
    assert last_killed < TOTAL, f"the run ended before the kill; stderr: {stderr[-2000:]}"

    output = run(script, directory, resumed_log, workers=1)
    resumed = read_log(resumed_log)
    (line,) = [line for line in output.splitlines() if line.startswith("resumed from step")]
    checkpoint = int(line.split()[3])
    assert checkpoint % EVERY == 0
    assert SECOND_EPOCH_CHECKPOINT <= checkpoint < last_killed
    assert sorted(resumed) == list(range(checkpoint + 1, TOTAL + 1))
    for step, loss in {**killed, **resumed}.items():
        assert loss == straight[step], f"step {step}: {loss} != {straight[step]}"
    # the steps after the checkpoint ran twice, in the killed and the resumed process
    assert all(killed[step] == resumed[step] for step in range(checkpoint + 1, last_killed + 1))


@pytest.mark.parametrize("script", sorted(REQUIRES))
def test_example_help_lists_its_flags(script):
    for module in REQUIRES[script]:
        pytest.importorskip(module)
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--workers", "--epochs", "--checkpoint-dir", "--checkpoint-every", "--loss-log"):
        assert flag in result.stdout
