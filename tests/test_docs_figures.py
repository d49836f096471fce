"""Every measured figure in docs/ names the benchmark run it comes from.

A timing a reader can compare (a before → after pair, a speed-up, a rate, a time per element,
a first batch) is a promise only if it can be traced to a benchmark and checked against its
recorded result. This test finds such figures in docs/*.md and requires, in the same
paragraph, list item or table row, a citation: a ``benchmarks/`` script or
``benchmarks/README.md`` (where the results are recorded), or the name of a benchmark
workload (``benchmarks/run.py --only NAME``). Constants of the code (a 30 s idle timeout,
a 1 ms chunk budget, 5 %) are not measurements and are not matched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_NUMBER = r"(?<![\w.,])\d[\d,]*(?:\.\d+)?"
_TIME = r"(?:µs|ms|s)\b"
_TIMES = "\N{MULTIPLICATION SIGN}"
# what a measurement looks like in prose (a constant is stated plainly: "waits 1 s")
MEASURED = {
    "a before/after pair": re.compile(
        rf"{_NUMBER}\s?(?:{_TIME})?\s?(?:→|->)\s?{_NUMBER}\s?{_TIME}"
    ),
    "a speed-up": re.compile(rf"(?<![\w.]){_NUMBER}\s?[x{_TIMES}](?![\w\d])"),
    "a rate": re.compile(rf"{_NUMBER}k?\s?(?:elements|items|records|batches)/s|{_NUMBER}k\b"),
    "a time per element": re.compile(
        rf"(?<!over )(?<!under )(?<!up to )(?<!below )(?<!above )"
        rf"{_NUMBER}\s?(?:µs|ms) (?:per|an?) (?:element|item|record|sequence|row)"
    ),
    "a first batch": re.compile(
        rf"(?:first batch|first output|start-up)[^.;|]{{0,40}}?{_NUMBER}\s?{_TIME}"
    ),
    "an approximate time": re.compile(rf"~{_NUMBER}\s?{_TIME}"),
}


def _workloads() -> set[str]:
    names = set()
    for path in (ROOT / "benchmarks").glob("workloads_*.py"):
        names |= set(re.findall(r'name="(\w+)"', path.read_text()))
    return names


WORKLOADS = _workloads()
_CITATION = re.compile(r"benchmarks/[\w./-]+|`(\w+)`")


def cites_a_benchmark(text: str) -> bool:
    return any(m.group(1) is None or m.group(1) in WORKLOADS for m in _CITATION.finditer(text))


def units(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list item and table row outside code blocks."""
    found, current, start, in_code = [], [], 0, False

    def flush():
        if current:
            found.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            continue
        if not stripped or stripped.startswith(("|", "#", "- ", "* ")):
            flush()
        if stripped:
            if not current:
                start = number
            current.append(stripped)
            if stripped.startswith(("|", "#")):
                flush()
    flush()
    return found


def uncited(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, figure) of each measured-looking figure in a unit that cites nothing."""
    problems = []
    for line, unit in units(text):
        if cites_a_benchmark(unit):
            continue
        for kind, pattern in MEASURED.items():
            problems += [(line, kind, match.group(0)) for match in pattern.finditer(unit)]
    return problems


def test_the_workload_names_are_found():
    assert {"mp_first_batch_torch_script", "iter_cheap_batch", "window_shuffle_iter"} <= WORKLOADS


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_measured_figure_in_the_docs_names_its_benchmark(path):
    problems = uncited(path.read_text())
    assert not problems, (
        f"{path.relative_to(ROOT)}: figures without the benchmark run they come from (name "
        "the workload, `benchmarks/run.py --only NAME`, and agree with its result recorded in "
        "benchmarks/README.md; or remove the figure):\n"
        + "\n".join(f"  line {line}: {kind}: {figure!r}" for line, kind, figure in problems)
    )


@pytest.mark.parametrize(
    "text",
    [
        "Measured: first batch 1.7 s in the first epoch, 6 ms in the later ones.",
        "the cheap chain runs at ~0.5 µs per item.",
        "first batch 0.3 \N{RIGHTWARDS ARROW} 1.9 ms.",
        "throughput (~800x SPDL on cheap items)",
        "64 threads of 2 ms reads: 18\N{EN DASH}22k elements/s.",
    ],
)
def test_an_uncited_measurement_is_found(text):
    assert uncited(text)
    assert not uncited(text + " (`iter_cheap_batch`, benchmarks/README.md)")


@pytest.mark.parametrize(
    "text",
    [
        "idle workers wait (30 s) for the next stage",
        "chunks that double up to 1024 items while they take under 1 ms",
        "once four chunks in a row cost over 20 µs per item",
        "a 4\N{MULTIPLICATION SIGN}2 mesh",
        "the hand-off stays under 5 % of their work",
    ],
)
def test_a_constant_of_the_code_is_not_taken_for_a_measurement(text):
    assert not uncited(text)
