"""Queue classes, stats records and profile_pipeline against spdl 0.8.0: the same names,
signatures, log format, queue construction and hook calls; data-item counts (the S2 fix)."""

import contextlib
import inspect
import logging
import re

import pytest
import spdl.pipeline as spdl_pipeline

import gristmill.pipeline as gm_pipeline

pytestmark = pytest.mark.parity
MODULES = {"gristmill": gm_pipeline, "spdl": spdl_pipeline}
LOGGERS = {"gristmill": "gristmill.pipeline", "spdl": "spdl.pipeline"}

# One regex for both libraries' end-of-run queue line (SPDL's format, §6.2).
LINE = re.compile(
    r"^\[(?P<name>\S+_queue)\]\tProcessed +(?P<items>\d+) items in +[\d.]+ \[ ?(us|ms|sec)\] "
    r"\(QPS: +[\d.]+\) Ave wait time: put: +[\d.]+ \[ ?\w+\], get \(by next stage\): "
    r"+[\d.]+ \[ ?\w+\]\. P90: put: +[\d.]+ \[ ?\w+\], get: +[\d.]+ \[ ?\w+\]\. "
    r"P99: put: +[\d.]+ \[ ?\w+\], get: +[\d.]+ \[ ?\w+\]\. Occupancy rate: \d+%$"
)


def plus_one(x):
    return x + 1


def halves(batch):
    return [x // 2 for x in batch]


def queue_counts(caplog, which):
    """``{queue name without the pipeline id: items}`` from ``which``'s log lines."""
    counts = {}
    for record in caplog.records:
        if record.name.startswith(LOGGERS[which]) and (match := LINE.match(record.getMessage())):
            counts[match["name"].split(":", 1)[1]] = int(match["items"])
    return counts


def run(which, builder_fn, **build):
    m = MODULES[which]
    pipeline = builder_fn(m.PipelineBuilder()).build(num_threads=2, **build)
    with pipeline.auto_stop():
        return list(pipeline)


def chain(b):
    return (
        b.add_source([[1, 2], [3], [4, 5, 6]])
        .pipe(halves, concurrency=4)
        .disaggregate()
        .add_sink(3)
    )


def test_record_fields_and_qps_match():
    for name in ("QueuePerfStats",):
        ours, theirs = getattr(gm_pipeline, name), getattr(spdl_pipeline, name)
        assert list(ours.__dataclass_fields__) == list(theirs.__dataclass_fields__)
    args = (2.0, 10, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
    assert gm_pipeline.QueuePerfStats(*args).qps == spdl_pipeline.QueuePerfStats(*args).qps == 5
    args = (0.0, 10, 0, 0, 0, 0, 0, 0, 0)
    assert gm_pipeline.QueuePerfStats(*args).qps == spdl_pipeline.QueuePerfStats(*args).qps == 0
    assert list(gm_pipeline.ProfileResult.__dataclass_fields__) == ["name", "stats"]
    assert list(spdl_pipeline.ProfileResult.__dataclass_fields__) == ["name", "stats"]


@pytest.mark.parametrize(
    "target",
    ["AsyncQueue.__init__", "StatsQueue.__init__", "profile_pipeline", "build_pipeline"],
)
def test_signatures_match(target):
    def parameters(module):
        obj = module
        for part in target.split("."):
            obj = getattr(obj, part)
        return [
            (p.name if p.kind != p.POSITIONAL_ONLY else "", p.kind, p.default)
            for p in inspect.signature(obj).parameters.values()
        ]

    assert parameters(gm_pipeline) == parameters(spdl_pipeline)


def test_log_lines_match_and_count_data_items_only_s2_fix(caplog):
    """SPDL 0.8.0 counts its EOF sentinel as an item (up to 21 for 20 items through a stage's
    queue); gristmill counts data items only (20 at every boundary), as the reference's S2
    fix asks. SPDL logs a queue's count when its producer ends, so a consumer that lags
    (a loaded machine) shows fewer: its runs are repeated until one shows the sentinel."""
    builder = lambda b: b.add_source(range(20)).pipe(plus_one).add_sink(3)  # noqa: E731
    with caplog.at_level(logging.INFO):
        assert run("gristmill", builder) == list(range(1, 21))
    ours = queue_counts(caplog, "gristmill")
    assert ours.keys() == {"0:src_queue", "1:plus_one_queue", "2:sink_queue"}
    assert ours == dict.fromkeys(ours, 20)
    seen = []
    for _ in range(SPDL_TRIES):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert run("spdl", builder) == list(range(1, 21))
        theirs = queue_counts(caplog, "spdl")
        assert theirs.keys() == ours.keys()
        seen.append(theirs["1:plus_one_queue"])
        if seen[-1] == 21:
            break
    assert max(seen) == 21, seen
    assert all(count <= 21 for count in seen), seen


SPDL_TRIES = 20


def test_queue_names_match(caplog):
    with caplog.at_level(logging.INFO):
        for which in MODULES:
            assert sorted(run(which, chain)) == [0, 1, 1, 2, 2, 3]
    names = {which: sorted(queue_counts(caplog, which)) for which in MODULES}
    assert (
        names["gristmill"]
        == names["spdl"]
        == [
            "0:src_queue",
            "1:halves[4]_queue",
            "2:disaggregate_queue",
            "3:sink_queue",
        ]
    )


def recording_queue_class(module, log):
    class Recording(module.AsyncQueue):
        def __init__(self, info, **kwargs):
            super().__init__(info, buffer_size=kwargs["buffer_size"])
            log.append(("init", str(info).split(":", 1)[1], tuple(sorted(kwargs.items()))))

        @contextlib.asynccontextmanager
        async def stage_hook(self):
            log.append(("enter", str(self.info).split(":", 1)[1]))
            yield
            log.append(("exit", str(self.info).split(":", 1)[1]))

    return Recording


@pytest.mark.parametrize("interval", [-1, 30])
def test_custom_queue_classes_are_built_and_hooked_alike(interval):
    """One queue per boundary, ``(info, buffer_size=2)`` between stages and the sink's size
    at the end, never ``interval`` (only the default class gets it); each hook entered and
    exited once."""
    logs = {}
    for which, module in MODULES.items():
        logs[which] = log = []
        queue_class = recording_queue_class(module, log)
        out = run(which, chain, queue_class=queue_class, report_stats_interval=interval)
        assert sorted(out) == [0, 1, 1, 2, 2, 3]
    for which, log in logs.items():
        inits = sorted(entry for entry in log if entry[0] == "init")
        assert inits == [
            ("init", "0:src", (("buffer_size", 2),)),
            ("init", "1:halves[4]", (("buffer_size", 2),)),
            ("init", "2:disaggregate", (("buffer_size", 2),)),
            ("init", "3:sink", (("buffer_size", 3),)),
        ], which
        for kind in ("enter", "exit"):
            assert sorted(e[1] for e in log if e[0] == kind) == [e[1] for e in inits], which


def test_queue_class_is_checked_only_by_gristmill():
    """spdl accepts anything as queue_class and fails later; gristmill names it at build."""
    with pytest.raises(TypeError, match="queue_class must be a subclass"):
        run("gristmill", chain, queue_class=dict)


# -- profile_pipeline ------------------------------------------------------------------------


def profile_config(module):
    builder = (
        module.PipelineBuilder()
        .add_source(range(100))
        .pipe(plus_one, concurrency=3)
        .aggregate(8)
        .disaggregate()
        .add_sink(3)
    )
    return builder.get_config()


def recording_profile_hook(module, log):
    class Recording(module.ProfileHook):
        @contextlib.contextmanager
        def stage_profile_hook(self, stage, concurrency):
            log.append(("stage", stage, concurrency))
            yield

        @contextlib.contextmanager
        def pipeline_profile_hook(self):
            log.append(("pipeline",))
            yield

    return Recording()


def test_profile_results_hooks_and_callbacks_match(caplog):
    runs, callbacks, hooks = {}, {}, {}
    with caplog.at_level(logging.WARNING):
        for which, module in MODULES.items():
            callbacks[which], hooks[which] = [], []
            runs[which] = module.profile_pipeline(
                profile_config(module),
                num_inputs=16,
                callback=callbacks[which].append,
                hook=recording_profile_hook(module, hooks[which]),
            )
    ours, theirs = runs["gristmill"], runs["spdl"]
    assert len(ours) == len(theirs) == 3
    for mine, upstream in zip(ours, theirs, strict=True):
        assert mine.name == upstream.name
        assert [s.concurrency for s in mine.stats] == [s.concurrency for s in upstream.stats]
        assert [list(s.__dataclass_fields__) for s in mine.stats] == [
            list(s.__dataclass_fields__) for s in upstream.stats
        ]
        assert all(s.qps > 0 and 0 <= s.occupancy_rate <= 1 for s in mine.stats)
    assert [r.name for r in ours] == [
        "plus_one",
        "aggregate(op=collate(8), drop_last=False)",
        "disaggregate",
    ]
    assert [[s.concurrency for s in r.stats] for r in ours] == [[32, 16, 8, 4, 1], [1], [1]]
    for which in MODULES:
        assert callbacks[which] == runs[which]
    assert hooks["gristmill"] == hooks["spdl"]
    assert hooks["gristmill"][0] == ("pipeline",)


def test_profile_runs_only_on_local_rank_zero(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    for which, module in MODULES.items():
        log = []
        result = module.profile_pipeline(
            profile_config(module), num_inputs=4, hook=recording_profile_hook(module, log)
        )
        assert list(result) == [], which
        assert log == [("pipeline",)], which  # the pipeline hook still runs
