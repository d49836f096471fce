"""The statistics table (``print(it.statistics())``, ``gristmill profile``, ``gristmill demo``,
``log_statistics_every``) fits the terminal it is printed to: 80 or 100 columns (100 where
there is no terminal), however long the stage names; and its rows count what the stages
count."""

import io
import logging

import pytest

import gristmill as gm
from gristmill.cli.demo import run_demo

LONG_CHAIN = "Source → WithSeed → Shuffle → Map(decode) → RandomMap(augment)"


def decode(x):
    return x + 1


def augment(x, rng):
    return x


def demo_like(threads):
    """The demo's chain: five fused nodes, a long stage name, then a batch."""
    ds = gm.MapDataset.source(list(range(512))).seed(3).shuffle().map(decode)
    read = ds.random_map(augment).to_iter_dataset(gm.ReadOptions(num_threads=threads))
    return read.batch(64, drop_remainder=True)


def statistics_of(ds):
    it = iter(ds)
    for _ in it:
        pass
    try:
        return it.statistics()
    finally:
        it.close()


@pytest.mark.parametrize("width", [80, 90, 100, 120])
@pytest.mark.parametrize("threads", [0, 4])
def test_the_table_fits_its_width_and_keeps_every_name_whole(width, threads):
    stats = statistics_of(demo_like(threads))
    table = stats.table(width)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= width, table
    # every name is there, wrapped at its arrows and spaces, never cut inside a word
    words = table.split()
    for name in (LONG_CHAIN, "RandomMap(augment)", "batch(64, drop_remainder=True)"):
        assert all(word in words for word in name.split()), (name, table)


def test_a_wide_terminal_keeps_each_row_on_one_line():
    stats = statistics_of(demo_like(threads=4))
    lines = stats.table(200).splitlines()
    assert len(lines) == 2 + len(stats.rows())
    assert any(line.startswith(LONG_CHAIN) for line in lines)


def test_print_fits_the_terminal_and_100_columns_without_one(monkeypatch):
    stats = statistics_of(demo_like(threads=4))
    monkeypatch.setenv("COLUMNS", "80")
    assert max(len(line) for line in str(stats).splitlines()) <= 80
    monkeypatch.delenv("COLUMNS")  # no terminal under pytest: the default
    assert max(len(line) for line in str(stats).splitlines()) <= 100


@pytest.mark.parametrize("columns", [80, 100])
def test_the_demo_table_fits_the_terminal(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    assert run_demo(records=256, batch_size=32, threads=2, seed=7, out=out)
    text = out.getvalue()
    table = text.split("per-stage statistics:\n")[1].split("bottleneck: ")[0]
    assert LONG_CHAIN.split()[0] in table
    assert max(len(line) for line in table.splitlines()) <= columns, table


def test_periodic_statistics_fit_the_terminal(monkeypatch, capsys):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no logging set up
    monkeypatch.setenv("COLUMNS", "80")
    gm.experimental.log_statistics_every(1e-9)
    try:
        list(demo_like(threads=2))
    finally:
        gm.experimental.log_statistics_every(None)
    err = capsys.readouterr().err
    table = err.split("gristmill statistics:\n")[-1].split("bottleneck: ")[0]
    assert "RandomMap(augment)" in table
    assert max(len(line) for line in table.splitlines()) <= 80, table


@pytest.mark.parametrize("threads", [0, 4])
def test_each_op_row_counts_every_element_its_stage_counts(threads):
    """The op rows of a fused read count the engine's first, probing read of one element
    (read untimed, as a plain ``_get``) as the stage does: 512 and 512, not 511."""
    stats = statistics_of(demo_like(threads))
    read = next(s for s in stats.stages if s.role == "read")
    assert read.elements_in == 512
    for op in stats.ops:
        assert (op.elements_in, op.elements_out) == (512, 512), (op.name, str(stats))


def odd(x):
    return x % 2 == 1


@pytest.mark.parametrize("threads", [0, 4])
@pytest.mark.parametrize("first", [0, 1], ids=["first-dropped", "first-kept"])
def test_a_filters_rows_count_the_untimed_read_where_it_was_dropped(threads, first):
    ds = gm.MapDataset.range(first, first + 300).map(decode).filter(odd).map(decode)
    stats = statistics_of(ds.to_iter_dataset(gm.ReadOptions(num_threads=threads)))
    rows = {op.name: (op.elements_in, op.elements_out) for op in stats.ops}
    assert rows == {
        "Range": (300, 300),
        "Map(decode)": (300, 300),
        "Filter(odd)": (300, 150),
        "Map(decode)#2": (150, 150),
    }, str(stats)
