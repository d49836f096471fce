"""The plan: the stages a running pipeline is made of, in order, and the one place their
settings are read and changed.

Both dialects lower to the same engine pieces (runners, streams, producers) and record each
piece they build as a :class:`PlannedStage` — the frozen ``StageSpec`` it was built from
(``engine/stage_spec.py``: name, :class:`Role`, op kinds, every setting and which of them may
change) and the piece — in pipeline order: the SPDL dialect while ``build()`` lowers the configs
(``Pipeline.plan()``), the dataset dialect when ``iter()`` builds the iterator graph
(``DatasetIterator.plan()``, each iterator adding the stages it runs after its parents').
A stage's settings — its workers (threads, processes or actors) and buffer bound — live in
its runner's policy and nowhere else; the plan is how they are listed (:meth:`Plan.settings`)
and changed while running (:meth:`Plan.configure`: the next task uses them; the output and
the checkpoint state never depend on them). Statistics are per planned stage too
(:meth:`Plan.statistics`). :meth:`Plan.describe` lists every stage, tunable or not, as
plain data.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gristmill._src.engine.stats import PipelineStatistics, StageStatistics
from gristmill._src.engine.tuner import Change, TuningBudget

if TYPE_CHECKING:  # stage_spec builds PlannedStages: it imports this module
    from gristmill._src.engine.stage_spec import StageSpec


class Role(enum.Enum):
    """What a planned stage does."""

    SOURCE = "source"
    """Reads the pipeline's source (an iterable, or another pipeline's output)."""
    READ = "read"
    """Reads a MapDataset chain by index (``to_iter_dataset``; ``mp_prefetch``'s workers)."""
    MAP = "map"
    """Applies an op or a chain of ops to each element (``pipe``, a threaded ``map``)."""
    AGGREGATE = "aggregate"
    """Groups elements into batches (``aggregate``, ``batch``, ``rebatch``, packing)."""
    SPLIT = "split"
    """Splits batches into elements (``disaggregate``)."""
    PATHS = "paths"
    """Routes elements down one of several sub-pipelines (``path_variants``)."""
    REGION = "region"
    """Runs a span of stages in worker processes (``to()``)."""
    MIX = "mix"
    """Takes each output from one of several iterators (``mix``)."""
    SHUFFLE = "shuffle"
    """Reads a window of elements and hands them on in shuffled order (``window_shuffle``)."""
    INTERLEAVE = "interleave"
    """Opens and reads several iterators at once (``interleave``)."""
    PREFETCH = "prefetch"
    """Runs everything upstream ahead on a thread of its own (a prefetch buffer)."""
    SINK = "sink"
    """Hands the outputs to the caller (a pipeline's ``add_sink`` buffer)."""


@dataclasses.dataclass(frozen=True, eq=False)
class PlannedStage:
    """One stage of a plan: the frozen description it was built from and the engine piece
    that runs it.

    Raises:
      TypeError: the spec says a setting may change while it runs but ``piece`` cannot
        change any (it has no ``configure`` and ``knobs``).
    """

    spec: StageSpec
    """What it was built from (``engine/stage_spec.py``): its name, role, op kinds (none for
    a stage that runs no element function of the user's) and every setting it started with,
    with the ones that may change while it runs (``spec.settings.tunable``)."""
    piece: Any
    """The runner, stream or counters behind the stage (engine internal)."""
    parts: tuple[Any, ...] = ()
    """Pieces with statistics only, one per op the stage runs fused (a read stage's
    MapDataset nodes): their rows are ``PipelineStatistics.ops``."""

    def __post_init__(self) -> None:
        live = hasattr(self.piece, "configure") and hasattr(self.piece, "knobs")
        if self.spec.settings.tunable and not live:
            raise TypeError(
                f"stage {self.spec.name!r}: its spec says {self.spec.settings.tunable} may "
                f"change while it runs, but its piece {type(self.piece).__name__} cannot "
                "change them; describe it with tunable=() (engine/stage_spec.fixed_stage)"
            )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def tunable(self) -> bool:
        """Whether some of its settings can change while it runs (its spec says which)."""
        return bool(self.spec.settings.tunable)

    def settings(self) -> dict[str, int]:
        """``{"workers": …, "buffer_size": …}`` for a tunable stage; ``{}`` otherwise. While
        the autotuner tries a change, the settings it chose before it."""
        if not self.tunable:
            return {}
        tuner = getattr(self.piece, "tuner", None)
        chosen = tuner.chosen if tuner is not None else None
        return chosen if chosen is not None else dict(self.piece.knobs)

    def describe(self) -> dict[str, Any]:
        """The stage as plain data: its name, role, op kinds, which settings may change and
        every setting (a tunable one's live value: what :meth:`settings` shows)."""
        shown = self.spec.settings.describe()
        shown.update(self.settings())
        return {
            "name": self.name,
            "role": self.role.value,
            "kinds": [op.kind.value for op in self.spec.ops],
            "tunable": list(self.spec.settings.tunable),
            "settings": shown,
        }

    def configure(self, *, workers: int | None = None, buffer_size: int | None = None) -> None:
        """Changes the stage's workers and/or buffer bound; the next task uses them."""
        if not self.tunable:
            raise ValueError(
                f"stage {self.name!r} ({self.role.value}) has no workers or buffer to change; "
                "configure a stage whose settings() are not empty"
            )
        for knob, value in (("workers", workers), ("buffer_size", buffer_size)):
            if value is not None and knob not in self.spec.settings.tunable:
                raise ValueError(
                    f"stage {self.name!r} ({self.role.value}) cannot change its {knob} while "
                    f"it runs; it can change {list(self.spec.settings.tunable)}"
                )
        _check_knob(workers, "workers", self.name, low=0)
        _check_knob(buffer_size, "buffer_size", self.name, low=1)
        self.piece.configure(workers=workers, buffer_size=buffer_size)

    def statistics(self) -> StageStatistics | None:
        """A snapshot of its counters (None for a piece that keeps none)."""
        snapshot = getattr(self.piece, "statistics", None)
        if snapshot is not None:
            return snapshot()  # type: ignore[no-any-return]
        counters = getattr(self.piece, "snapshot", None)
        return counters() if counters is not None else None


class Plan:
    """A running pipeline's stages, upstream first (see the module docstring)."""

    def __init__(self, stages: Iterable[PlannedStage] = ()) -> None:
        self._stages = tuple(stages)

    @classmethod
    def joined(cls, plans: Iterable[Plan], *after: PlannedStage) -> Plan:
        """The stages of ``plans`` in turn (a node's parents), then ``after``."""
        return cls([*(stage for plan in plans for stage in plan.stages), *after])

    @property
    def stages(self) -> tuple[PlannedStage, ...]:
        return self._stages

    def keys(self) -> list[str]:
        """Each stage's key, upstream first: its name, or for the ``k``-th stage of a name
        that several stages have (a mixture's sources), ``"<name> #k"`` (``k >= 2``), so
        that :meth:`settings` and :meth:`apply` name every stage, not one of them."""
        seen: dict[str, int] = {}
        keys = []
        for stage in self._stages:
            count = seen[stage.name] = seen.get(stage.name, 0) + 1
            keys.append(stage.name if count == 1 else f"{stage.name} #{count}")
        return keys

    def stage(self, name: str) -> PlannedStage:
        """The stage called ``name`` (as ``statistics()`` names it; ``"<name> #k"`` for the
        ``k``-th of several of that name: :meth:`keys`)."""
        for key, stage in zip(self.keys(), self._stages, strict=True):
            if key == name:
                return stage
        raise KeyError(f"no stage named {name!r} in this plan; its stages are {self.keys()}")

    def settings(self) -> dict[str, dict[str, int]]:
        """Every tunable stage's settings by key (:meth:`keys`): what a tuner would freeze
        and a user paste back (``configure(key, **settings[key])``)."""
        return {
            key: stage.settings()
            for key, stage in zip(self.keys(), self._stages, strict=True)
            if stage.tunable
        }

    def describe(self) -> list[dict[str, Any]]:
        """Every stage as plain data, upstream first: name, role, op kinds, which settings
        may change while it runs, and every setting it has (tunable ones live). For tools
        (the autotuner, ``gristmill profile``); :meth:`settings` is what ``apply`` takes."""
        return [stage.describe() for stage in self._stages]

    def configure(
        self, name: str, *, workers: int | None = None, buffer_size: int | None = None
    ) -> None:
        """Changes stage ``name``'s workers and/or buffer bound while it runs."""
        self.stage(name).configure(workers=workers, buffer_size=buffer_size)

    def apply(self, settings: Mapping[str, Mapping[str, int]]) -> None:
        """Applies what :meth:`settings` returned (for every stage it names); those stages
        are no longer autotuned."""
        for name, knobs in settings.items():
            self.configure(name, **knobs)

    def autotune(self, budget: TuningBudget | None = None) -> None:
        """Hands every tunable stage's workers and buffer to the autotuner
        (``engine/tuner.py``), starting from their settings now; ``settings()`` then shows
        what it chose, to freeze with ``apply()``. Output and state do not change.

        Raises:
          ValueError: no stage can be tuned yet (a dataset iterator builds its stages at
            its first ``next()``).
        """
        tunable = [s for s in self._stages if s.tunable and hasattr(s.piece, "autotune")]
        if not tunable:
            raise ValueError(
                "no stage of this plan can be tuned: a dataset iterator builds its stages at "
                "its first next(), so call it.plan().autotune() after next(it); a stage "
                "with no workers of ours (a source, a sink) is not tuned"
            )
        for stage in tunable:
            stage.piece.autotune(
                budget,
                freeze=lambda knobs, name=stage.name: f"plan().apply({{{name!r}: {knobs}}})",
            )

    def changes(self) -> dict[str, list[Change]]:
        """Every autotuned stage's changes so far, by key (:meth:`keys`), oldest first."""
        return {
            key: list(stage.piece.tuner.changes)
            for key, stage in zip(self.keys(), self._stages, strict=True)
            if getattr(stage.piece, "tuner", None) is not None
        }

    def statistics(self) -> PipelineStatistics:
        """Snapshots of every stage that keeps counters, upstream first."""
        rows: list[StageStatistics] = []
        ops: list[StageStatistics] = []
        for stage in self._stages:
            ops.extend(part.statistics() for part in stage.parts)
            own = stage.statistics()
            if own is not None:
                rows.append(dataclasses.replace(own, role=stage.role.value))
        return PipelineStatistics(stages=tuple(rows), ops=tuple(ops))

    def __len__(self) -> int:
        return len(self._stages)

    def __str__(self) -> str:
        """One line per stage: role, name, op kinds, then its settings — a tunable stage's
        live ones in parentheses, another's (read-only, from its spec) after ``fixed:``."""
        return "\n".join(_line(stage) for stage in self._stages)


def _line(stage: PlannedStage) -> str:
    kinds = ", ".join(op.kind.value for op in stage.spec.ops)
    line = f"{stage.role.value:>10}  {stage.name}" + (f"  [{kinds}]" if kinds else "")
    if stage.tunable:
        knobs = stage.settings()
        return line + "  (" + ", ".join(f"{k}={v}" for k, v in knobs.items()) + ")"
    fixed = {
        key: value
        for key, value in stage.spec.settings.describe().items()
        if isinstance(value, int) and value  # its counts; what is 0 (none) is left out
    }
    if fixed:
        line += "  (fixed: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) + ")"
    return line


def _check_knob(value: Any, name: str, stage: str, *, low: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"{name} for stage {stage!r} must be an integer >= {low}, got {value!r}; "
            f"e.g. configure({stage!r}, {name}={max(low, 2)})"
        )
