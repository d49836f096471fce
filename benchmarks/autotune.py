"""The autotuner's table (issue 35): six pipelines, one tuner, against a sweep, in one run.

This prints ``tuner_six.py``'s table (its docstring says what each row measures): for an
I/O-bound read, a GIL-bound and a GIL-free decode, a mixture of 64 unequal sources, a
heavy-tailed stage and one whose best setting needs worker processes, the defaults' and
the tuned rate from 5 s on as ratios to the best fixed setting of a sweep, and when the
tuned run first reached 90 % of it. Every option of ``tuner_six.py`` applies
(``--runs 3`` ends with the medians). ``autotune_misconfigured.py`` is the older
comparison: three mis-configured settings handed to ``plan().autotune()``.

Run: ``python benchmarks/autotune.py --runs 3`` (about 12 minutes on 2 cores).
"""

from __future__ import annotations

import tuner_six

if __name__ == "__main__":
    tuner_six.main()
