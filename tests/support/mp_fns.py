"""Module-level functions for mp_prefetch tests (worker processes import them by name)."""

import os


def times_ten(x):
    return x * 10


def keep_odd(x):
    return x % 2 == 1


def pid_and(x):
    return (os.getpid(), x)


def fail_on_5(x):
    if x == 5:
        raise ValueError(f"bad element {x}")
    return x


def exit_on_7(x):
    if x == 7:
        os._exit(3)
    return x


def busy(x):
    total = 0
    for i in range(2000):
        total += i
    return x


def record_init(index, count):
    os.environ["GRISTMILL_WORKER"] = f"{index}/{count}"


def worker_tag(x):
    return os.environ.get("GRISTMILL_WORKER")


def jitter(x, rng):
    return int(x + rng.integers(0, 5))


def slow_pid_and(x):
    busy(x)
    return (os.getpid(), x)


def big_array(i):
    import numpy as np

    return {"image": np.full((256, 256, 3), i % 251, np.uint8), "label": i}


def big_array_then_exit(i):
    if i == 40:
        os._exit(5)
    return big_array(i)


import gristmill as _gm  # noqa: E402


class PlusHundred(_gm.transforms.Map):
    """A module-level Map transformation (worker processes import it by name)."""

    def map(self, x):
        return x + 100


def shm_batch(records):
    """A batch_fn that returns its batch in a SharedMemoryArray (as Grain users do)."""
    from gristmill.multiprocessing import SharedMemoryArray

    out = SharedMemoryArray((len(records), 4), dtype="int64")
    for i, r in enumerate(records):
        out[i] = r
    out.unlink_on_del()
    return out


def read_shared(args):
    source, index = args
    return source[index]


def image_checksum(x):
    return (int(x["image"].sum()), x["label"], os.getpid())


def brighter(x):
    return {"image": x["image"] + 1, "label": x["label"]}


def fail_once_at_5(marker, x):
    """Fails the first time it sees 5 (``marker``: a path that records it, across workers)."""
    if x == 5 and not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError(f"transient failure at {x}")
    return x


def own_shm_segments():
    """The /dev/shm segments of this process's stages (named ``gristmill-<pid>-…`` after the
    consumer's pid): other processes' segments (a run in the background) do not count."""
    import glob

    return set(glob.glob(f"/dev/shm/gristmill-{os.getpid()}-*"))


def in_shared_memory(array):
    """Whether ``array``'s memory lies in a mapping of a /dev/shm file (an array received
    through shared memory), read from /proc/self/maps."""
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return True
    return False


class NotMultipleOfThree(_gm.transforms.Filter):
    def filter(self, x):
        return x % 3 != 0


class OddTwice(_gm.transforms.FlatMap):
    """``x`` once if even, ``x`` and ``x + 100`` if odd."""

    max_fan_out = 2

    def flat_map(self, x):
        return [x, x + 100][: 1 + x % 2]


def sleep_after_first(x):
    """Element 0 at once; every later one sleeps a minute (a worker busy when the stage closes)."""
    if x > 0:
        import time

        time.sleep(60)
    return x
