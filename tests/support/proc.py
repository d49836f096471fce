"""What /proc says of a process, in tests."""


def pss(pid):
    """``pid``'s proportional set size in bytes (0 where it has ended)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # it ended meanwhile
        pass
    return 0


def end_forked_children(timeout_s=30.0):
    """Ends this process's multiprocessing children before its PSS is measured: a forked
    child shares this process's pages, and when it exits they count here in full (a pytest
    worker of 300 MiB, whose idle pooled worker from an earlier test expires mid-measurement,
    seems to grow by 150 MiB). Idle pooled workers are stopped; others are waited for."""
    import multiprocessing
    import time

    from gristmill._src.engine import worker_pool

    deadline = time.monotonic() + timeout_s
    while multiprocessing.active_children():
        worker_pool.shutdown_idle_workers()
        assert time.monotonic() < deadline, (
            f"children still running after {timeout_s} s: {multiprocessing.active_children()}"
        )
        time.sleep(0.05)
