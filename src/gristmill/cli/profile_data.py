"""``gristmill profile --json``: the run, the table's rows, the plan and the verdict as one
JSON-able object (the text and the report render the same :class:`Profile`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gristmill._src.engine.stats import StageStatistics
from gristmill.cli.profile import Profile

_SERIES_FIELDS = ("recent_consumer_waits_s", "recent_full_s")
"""Fields of a stage row left out of ``--json`` (up to 1,024 durations each)."""


def stage_dict(s: StageStatistics) -> dict[str, Any]:
    """One row of the table as JSON-able data: every counter of the snapshot (not the
    recent waits' durations), its idle time and its thread time's shares."""
    row = {
        field.name: getattr(s, field.name)
        for field in dataclasses.fields(s)
        if field.name not in _SERIES_FIELDS
    }
    row["tuning"] = dataclasses.asdict(s.tuning) if s.tuning is not None else None
    row["idle_s"] = s.idle_s
    row["shares"] = dataclasses.asdict(s.shares())
    return row


def profile_dict(profile: Profile) -> dict[str, Any]:
    """``gristmill profile --json``'s object: the run, every row of the table (the ops of
    a fused stage before it, ``part_of`` naming it), ``plan().describe()`` (None where what
    was read has no plan) and the verdict (:meth:`Verdict.to_dict`)."""
    return {
        "target": profile.target,
        "returned": profile.kind.value,
        "elements": profile.elements,
        "seconds": profile.seconds,
        "elements_per_s": profile.elements_per_s,
        "stopped_by": profile.stopped_by,
        "stages": [stage_dict(s) for s in profile.statistics.rows()],
        "plan": list(profile.plan) if profile.plan is not None else None,
        "verdict": profile.verdict.to_dict(),
    }
