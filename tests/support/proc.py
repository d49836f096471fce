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
