"""gristmill.training.progress: batches/s and the share of the loop spent waiting for data."""

import io
import re
import sys
import time
import tomllib
from pathlib import Path

import pytest

import gristmill as gm
from gristmill.training import progress

ROOT = Path(__file__).resolve().parents[2]


def slow_items(n, seconds):
    for i in range(n):
        time.sleep(seconds)
        yield i


def test_the_meter_passes_items_through_and_counts_them():
    meter = progress(range(5), show=False)
    assert list(meter) == [0, 1, 2, 3, 4]
    summary = meter.summary()
    assert summary["items"] == 5
    assert summary["seconds"] >= 0


def test_a_slow_source_shows_as_data_wait_and_a_slow_step_does_not():
    waiting = progress(slow_items(10, 0.02), show=False)
    for _ in waiting:
        pass
    stepping = progress(range(10), show=False)
    for _ in stepping:
        time.sleep(0.02)
    assert waiting.wait_share() > 0.8
    assert stepping.wait_share() < 0.2
    assert waiting.summary()["wait_s"] >= 10 * 0.02 * 0.9


def test_the_bar_shows_the_rate_and_the_data_wait():
    out = io.StringIO()
    ds = gm.MapDataset.range(12).to_iter_dataset().batch(4)
    batches = list(progress(ds, desc="train", file=out))
    assert len(batches) == 3
    text = out.getvalue()
    assert "train" in text
    assert "3/3" not in text  # an IterDataset has no length
    assert "3batch" in text.replace(" ", "")
    assert "data wait" in text


def test_the_total_comes_from_len_when_there_is_one():
    out = io.StringIO()
    list(progress([1, 2, 3], file=out))
    assert "3/3" in out.getvalue()


def test_leaving_early_closes_the_bar():
    out = io.StringIO()
    for _ in progress(range(100), file=out, total=100):
        break
    assert "1/100" in out.getvalue()


def test_tqdm_comes_with_the_core_install_and_the_progress_extra_still_resolves():
    """A plain ``pip install -e .`` draws the bar: tqdm is a dependency of gristmill itself;
    ``pip install -e '.[progress]'`` (older instructions) still installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ ;\[]", requirement)[0] for requirement in project["dependencies"]]
    assert "tqdm" in names
    assert "progress" in project["optional-dependencies"]


def test_measuring_alone_draws_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # no bar is made, so tqdm is not needed
    meter = progress(range(3), show=False)
    assert list(meter) == [0, 1, 2]
    assert meter.summary()["items"] == 3


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="iterable must be iterable"):
        progress(3)
    with pytest.raises(ValueError, match="total"):
        progress([1], total=-1)


def test_a_step_meter_driven_by_hand_measures_like_the_wrapper():
    meter = gm.training.StepMeter(show=False)
    for _ in range(5):
        meter.waiting()
        time.sleep(0.01)  # the data
        meter.received()
        # the step: nothing
    meter.finish()
    meter.finish()  # idempotent
    summary = meter.summary()
    assert summary["items"] == 5
    assert meter.wait_share() > 0.8
    meter.waiting()  # after finish: nothing more is counted
    meter.received()
    assert meter.summary()["items"] == 5


def test_a_step_meter_draws_its_bar_from_the_first_request_to_finish():
    out = io.StringIO()
    meter = gm.training.StepMeter(desc="pass", file=out)
    assert out.getvalue() == ""
    meter.waiting()
    meter.received()
    meter.finish()
    assert "pass" in out.getvalue()
    assert "1batch" in out.getvalue().replace(" ", "")
