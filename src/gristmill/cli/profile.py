"""``gristmill profile MODULE:FUNCTION``: reads a pipeline for a while, sampling its per-stage
statistics, then prints the table and the bottleneck and writes a report (``cli/report.py``).

FUNCTION is called with no arguments and returns what a training loop would read:

* a :class:`gristmill.MapDataset`, read as ``ds.to_iter_dataset()`` reads it (its default
  ``ReadOptions``: 16 threads, 500 elements ahead); to profile other read options, return
  ``ds.to_iter_dataset(gm.ReadOptions(...))`` instead;
* a :class:`gristmill.IterDataset`, read as ``iter(ds)``;
* a :class:`gristmill.DatasetIterator`, read as it is;
* a :class:`gristmill.pipeline.Pipeline`, started here unless it already was.

Elements are taken as fast as they come (no training step) until ``--seconds`` pass,
``--count`` elements arrive or the data ends, whichever is first; the reader is closed (a
pipeline stopped) at the end. The clock is read between elements: statistics are sampled
every :data:`SAMPLE_INTERVAL_S` from the consuming loop itself, so no thread is started, and
a slow element only makes one sample interval (or the run) longer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib
import importlib.util
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import gristmill as gm
from gristmill._src.engine.stats import PipelineStatistics, TimeShares, Tuning
from gristmill._src.engine.stats_table import indented_table
from gristmill._src.engine.verdict import Verdict

SAMPLE_INTERVAL_S = 0.2
"""Seconds between two statistics samples (at least: the clock is read between elements)."""
DEFAULT_REPORT_DIR = "gristmill-profile"
ACCEPTED = (
    "a gristmill.MapDataset, IterDataset or DatasetIterator, or a gristmill.pipeline.Pipeline"
)


class ProfileError(Exception):
    """A usage error: ``run`` prints its message as one line and exits with status 2."""


class Kind(enum.Enum):
    """What FUNCTION returned, and so how it is read."""

    MAP_DATASET = "a MapDataset, read with to_iter_dataset() (default ReadOptions)"
    ITER_DATASET = "an IterDataset, read with iter()"
    ITERATOR = "a DatasetIterator"
    PIPELINE = "an SPDL-style Pipeline"


@dataclasses.dataclass(frozen=True)
class StagePoint:
    """One stage's counters at one sample (what the plots over time need)."""

    name: str
    executor: str
    elements_out: int
    buffer_occupancy: int
    buffer_size: int


@dataclasses.dataclass(frozen=True)
class Sample:
    """Every stage's counters ``t_s`` seconds after the profile started."""

    t_s: float
    stages: tuple[StagePoint, ...]


@dataclasses.dataclass(frozen=True)
class Profile:
    """The outcome of one profiling run."""

    target: str
    """``MODULE:FUNCTION`` as given."""
    kind: Kind
    elements: int
    """Elements the loop took."""
    seconds: float
    """Seconds from the first request to the last element."""
    stopped_by: str
    """What ended the run: ``"--seconds 10"``, ``"--count 100"`` or ``"the end of the data"``."""
    statistics: PipelineStatistics
    """The last snapshot, taken after the last element."""
    samples: tuple[Sample, ...]
    """Snapshots over time, the first at 0 s, the last with :attr:`statistics`."""
    plan: tuple[dict[str, Any], ...] | None = None
    """``plan().describe()`` of what was read, taken at the end (None: it has no plan)."""

    @functools.cached_property
    def verdict(self) -> Verdict:
        """The verdict on :attr:`statistics`, computed once: the printout, the report and
        ``--json`` all render this one object."""
        return self.statistics.verdict()

    @property
    def elements_per_s(self) -> float:
        return self.elements / self.seconds if self.seconds > 0 else 0.0

    def tuning(self) -> dict[str, Tuning]:
        """What the autotuner chose, by stage, as :attr:`statistics` recorded it (the one
        record the table, the printout and the report all show)."""
        return {s.name: s.tuning for s in self.statistics.stages if s.tuning is not None}


# -- finding FUNCTION ------------------------------------------------------------------------


def load_function(spec: str) -> Callable[[], Any]:
    """The function ``spec`` (``MODULE:FUNCTION``) names, its module imported."""
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name.isidentifier():
        raise ProfileError(
            f"expected MODULE:FUNCTION (e.g. mypkg.data:build or data.py:build), got {spec!r}"
        )
    module = import_module(module_name)
    function = getattr(module, function_name, None)
    if function is None:
        raise ProfileError(f"module {module_name!r} has no function {function_name!r}")
    if not callable(function):
        raise ProfileError(
            f"{spec} is a {type(function).__name__}, not a function; name a function that "
            "takes no arguments and returns the pipeline"
        )
    return function  # type: ignore[no-any-return]


def import_module(name: str) -> Any:
    """A dotted module importable from the current directory, or a ``.py`` file."""
    if name.endswith(".py") or os.sep in name or "/" in name:
        return _import_file(Path(name))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: the current directory's modules
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise ProfileError(
                f"no module named {name!r} from {os.getcwd()}; give a module importable "
                "from the current directory, or a path to a .py file"
            ) from None
        raise  # the module itself failed to import something: its traceback helps


def _import_file(path: Path) -> Any:
    """Imports ``path`` as the module of its stem, its folder first on ``sys.path`` (as
    ``python path.py`` does, so its siblings import and worker processes find it)."""
    if not path.is_file():
        raise ProfileError(f"no such file: {str(path)!r} (MODULE ending in .py is a file path)")
    path = path.resolve()
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ProfileError(
            f"{str(path)!r} would be imported as {name!r}, which is already the module "
            f"{getattr(loaded, '__file__', None) or name!r}; rename the file"
        )
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None  # a .py file always has a spec and a loader
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# -- reading --------------------------------------------------------------------------------


def classify(value: Any) -> Kind:
    """What FUNCTION returned; ProfileError for anything that is not read here."""
    from gristmill.pipeline import Pipeline  # on use: it adds to every command's start

    if isinstance(value, gm.MapDataset):
        return Kind.MAP_DATASET
    if isinstance(value, gm.IterDataset):
        return Kind.ITER_DATASET
    if isinstance(value, gm.DatasetIterator):
        return Kind.ITERATOR
    if isinstance(value, Pipeline):
        return Kind.PIPELINE
    raise ProfileError(
        f"the function returned {_describe(value)}; expected {ACCEPTED} (an SPDL-style "
        "pipeline: PipelineBuilder()...build(num_threads=...))"
    )


def _describe(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if value is not None else "None"


@contextlib.contextmanager
def reader(value: Any, kind: Kind) -> Iterator[tuple[Iterator[Any], Any]]:
    """``(iterator, the object whose statistics() describe it)``; closed (stopped) on exit."""
    with contextlib.ExitStack() as stack:
        if kind is Kind.PIPELINE:
            if not value.started:
                stack.enter_context(value.auto_stop())
            else:
                stack.callback(value.stop)
            yield value.get_iterator(), value
            return
        if kind is Kind.MAP_DATASET:
            value = value.to_iter_dataset()
        iterator = value if kind is Kind.ITERATOR else iter(value)
        stack.enter_context(contextlib.closing(iterator))
        yield iterator, iterator


def profile_function(
    function: Callable[[], Any],
    target: str,
    *,
    seconds: float,
    count: int | None = None,
    interval_s: float = SAMPLE_INTERVAL_S,
    tune: bool = False,
) -> Profile:
    """Calls ``function()`` and reads what it returns (see the module docstring); with
    ``tune``, the autotuner tunes every stage it can from the first element on."""
    value = function()
    kind = classify(value)
    with reader(value, kind) as (iterator, observed):
        profile = consume(
            iterator,
            observed.statistics,
            target=target,
            kind=kind,
            seconds=seconds,
            count=count,
            interval_s=interval_s,
            after_first=(lambda: _autotune(observed)) if tune else None,
        )
        return dataclasses.replace(profile, plan=_described(observed))


def _described(observed: Any) -> tuple[dict[str, Any], ...] | None:
    """``observed.plan().describe()``, or None where it has no plan to describe."""
    plan = getattr(observed, "plan", None)
    if plan is None:
        return None
    try:
        return tuple(plan().describe())
    except (AttributeError, ValueError):  # a plan that cannot describe itself
        return None


def _autotune(observed: Any) -> None:
    """Hands what ``observed`` runs to the autotuner (nothing, if no stage can be tuned)."""
    with contextlib.suppress(ValueError):
        observed.plan().autotune()


def consume(
    iterator: Iterator[Any],
    statistics: Callable[[], PipelineStatistics],
    *,
    target: str,
    kind: Kind,
    seconds: float,
    count: int | None = None,
    interval_s: float = SAMPLE_INTERVAL_S,
    after_first: Callable[[], None] | None = None,
) -> Profile:
    """Takes elements until ``seconds``, ``count`` or the end, sampling ``statistics()``
    whenever ``interval_s`` passed since the last sample (checked between elements);
    ``after_first()`` runs once, after the first element."""
    limit = math.inf if count is None else count
    started = time.perf_counter()
    samples = [sample(0.0, statistics())]
    due = started + interval_s
    elements = 0
    stopped_by = "the end of the data"
    for _ in iterator:
        elements += 1
        if elements == 1 and after_first is not None:
            after_first()
        now = time.perf_counter()
        if elements >= limit:
            stopped_by = f"--count {count}"
            break
        if now - started >= seconds:
            stopped_by = f"--seconds {seconds:g}"
            break
        if now >= due:
            samples.append(sample(now - started, statistics()))
            due = now + interval_s
    elapsed = time.perf_counter() - started
    final = statistics()
    if len(samples) > 1 and elapsed - samples[-1].t_s < interval_s / 2:
        samples.pop()  # the final snapshot replaces it: no rate over a sliver of time
    samples.append(sample(elapsed, final))
    return Profile(target, kind, elements, elapsed, stopped_by, final, tuple(samples))


def sample(t_s: float, stats: PipelineStatistics) -> Sample:
    """What the plots over time keep of a snapshot (its stages, not their fused ops)."""
    return Sample(
        t_s,
        tuple(
            StagePoint(s.name, s.executor, s.elements_out, s.buffer_occupancy, s.buffer_size)
            for s in stats.stages
        ),
    )


# -- the time series and shares the report plots --------------------------------------------


Series = dict[str, tuple[list[float], list[float]]]
"""Per stage name (pipeline order): the times (s) and the values at them, one per sample
time (NaN where the stage had no sample: a gap, not a value)."""

GAP = math.nan
"""A value that a stage has not at a sample: plots leave a gap there."""


def throughput_series(samples: tuple[Sample, ...]) -> Series:
    """Each stage's elements delivered per second over each sample interval, at its end.

    A stage not built yet at the interval's start (the first request builds a dataset
    iterator's stages) had delivered 0; one that is not in the interval's closing sample
    has no rate there (NaN)."""
    names = _names(samples)
    series: Series = {name: ([], []) for name in names}
    for before, after in itertools.pairwise(samples):
        dt = after.t_s - before.t_s
        if dt <= 0:
            continue
        previous = {p.name: p.elements_out for p in before.stages}
        now = {p.name: p.elements_out for p in after.stages}
        for name in names:
            times, rates = series[name]
            times.append(after.t_s)
            out = now.get(name)
            rates.append(GAP if out is None else (out - previous.get(name, 0)) / dt)
    return series


def fill_series(samples: tuple[Sample, ...]) -> Series:
    """Each stage's buffer fill (occupancy / buffer size) at each sample, for the stages
    that ran on workers at some sample: NaN where one ran inline (it has no buffer of its
    own: its occupancy is its chunk) or was not built yet."""
    names = [
        name
        for name in _names(samples)
        if any(_buffered(p) for s in samples for p in s.stages if p.name == name)
    ]
    series: Series = {name: ([], []) for name in names}
    for s in samples:
        points = {p.name: p for p in s.stages}
        for name in names:
            times, fills = series[name]
            point = points.get(name)
            times.append(s.t_s)
            fills.append(
                point.buffer_occupancy / point.buffer_size
                if point is not None and _buffered(point)
                else GAP
            )
    return series


def _buffered(point: StagePoint) -> bool:
    return point.buffer_size > 0 and point.executor != "inline"


def _names(samples: tuple[Sample, ...]) -> list[str]:
    """Every stage name of ``samples``, in pipeline order (as the last sample has them)."""
    names: dict[str, None] = {}
    for s in reversed(samples):
        for p in s.stages:
            names.setdefault(p.name)
    last = [p.name for p in samples[-1].stages] if samples else []
    return last + [name for name in names if name not in last]


UNIT_NAMES = ("records", "batches")
"""What a stage delivers, by how many aggregates (batches) are before it: more than one,
``batches of batches``, ..."""


def unit_of(level: int) -> str:
    """The name of what a stage ``level`` aggregates deep delivers: records, batches, ..."""
    if level < len(UNIT_NAMES):
        return UNIT_NAMES[level]
    return " of ".join(["batches"] * level)


def units(stats: PipelineStatistics) -> dict[str, str]:
    """What each stage delivers (``"records"``, ``"batches"``, ...): each aggregate in
    pipeline order (a stage, or a MapDataset batch fused in a read stage) makes batches of
    what came before it, each split (``disaggregate``) undoes one. A stage that has several
    parents (a mix) delivers what the parent before it in the pipeline order does."""
    level = 0
    out: dict[str, str] = {}
    for stage in stats.stages:
        level += sum(1 for op in stats.ops if op.part_of == stage.name and op.role == "aggregate")
        if stage.role == "aggregate":
            level += 1
        elif stage.role == "split":
            level = max(0, level - 1)
        out[stage.name] = unit_of(level)
    return out


def shares(stats: PipelineStatistics) -> list[tuple[str, TimeShares]]:
    """Every stage's thread time as shares of its capacity (working, starved, blocked,
    idle: they add up to 1), upstream first."""
    return [(s.name, s.shares()) for s in stats.stages]


# -- printing -------------------------------------------------------------------------------


def tuning_line(profile: Profile) -> str | None:
    """What the autotuner chose (from the statistics' one record), or None where it tuned
    no stage: the settings to paste back, the changes it kept, any trial under way."""
    tuning = profile.tuning()
    if not tuning:
        return None
    changes = sum(t.changes for t in tuning.values())
    chosen = {name: t.chosen for name, t in tuning.items()}
    line = (
        f"autotuned ({changes} change{'s' if changes != 1 else ''}; paste back with "
        f"plan().apply(...) to freeze): {chosen}"
    )
    trials = [
        f"{name!r} " + ", ".join(f"{k} {v}" for k, v in t.trying.items())
        for name, t in tuning.items()
        if t.trying
    ]
    if trials:
        line += f"; trying now (* in the table, kept only if it pays): {'; '.join(trials)}"
    return line


def waiting_line(verdict: Verdict) -> str | None:
    """The share of the consumer's time spent waiting for data (None: not measured)."""
    if verdict.waiting_fraction is None:
        return None
    return f"waited for data {verdict.waiting_fraction:.0%} of its time"


def print_profile(profile: Profile, out: TextIO) -> None:
    """The summary, the per-stage table and the verdict (its suggestions included)."""
    out.write(f"gristmill profile: {profile.target} returned {profile.kind.value}\n")
    out.write(
        f"  {profile.elements:,} elements in {profile.seconds:.2f} s "
        f"({profile.elements_per_s:,.0f} elements/s), stopped by {profile.stopped_by}\n\n"
    )
    out.write(f"per-stage statistics ({SHARES_NOTE}):\n")
    out.write(indented_table(profile.statistics))
    out.write(f"bottleneck: {profile.verdict}\n")
    waiting = waiting_line(profile.verdict)
    if waiting is not None:
        out.write(f"consumer: {waiting}\n")
    tuned = tuning_line(profile)
    if tuned is not None:
        out.write(tuned + "\n")


SHARES_NOTE = "work, starved, blocked: % of each stage's thread time"
