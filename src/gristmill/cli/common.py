"""What the ``gristmill`` commands share: the formats they accept, and how a failure reads
(one line, or the traceback when :data:`TRACEBACK_VARIABLE` is ``1``)."""

from __future__ import annotations

DEMO_FORMATS = ("auto", "memory", "tfrecord", "parquet", "array_record")
"""Where ``gristmill demo`` keeps its records (see ``cli/demo_files.py``)."""

INSPECT_FORMATS = ("auto", "tfrecord", "parquet", "array_record")
"""What ``gristmill inspect --format`` accepts (see ``cli/inspect.py``)."""

TRACEBACK_VARIABLE = "GRISTMILL_TRACEBACK"


def describe(error: BaseException) -> str:
    """``error`` as one line: its message where gristmill wrote one to be read (ValueError,
    OSError, ImportError: they name the file, the value and the fix), else its type too."""
    text = str(error)
    if isinstance(error, OSError) and error.strerror:  # not "[Errno 2] ...: 'path'"
        text = error.strerror
        if error.filename is not None and str(error.filename) not in text:
            text = f"{text}: {error.filename!r}"
    message = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    if message and isinstance(error, ValueError | OSError | ImportError):
        return message
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
