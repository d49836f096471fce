"""``batch`` over ``to_iter_dataset`` takes a batch's elements in one call, not one call each.

The batch asks its parent for the whole batch at once; a ``to_iter_dataset`` iterator hands
over a slice of the chunk it holds. What comes out, the states and the filtered-ratio checks
must be exactly those of taking the elements one ``next()`` at a time.
"""

import sys

import numpy as np
import pytest

import gristmill as gm

M = gm.MapDataset


def _hole_every(k):
    """A map that filters out (returns None for) every k-th element."""

    def f(x):
        return None if x % k == k - 1 else x

    return f


def _one_at_a_time(ds, batch_size, drop_remainder):
    """The batches a loop of next() over ``ds``'s iterator makes, as lists."""
    elements = list(ds)
    batches = [elements[i : i + batch_size] for i in range(0, len(elements), batch_size)]
    if drop_remainder and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


@pytest.mark.parametrize("batch_size", [1, 7, 32, 300])
@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize(
    ("transform", "allow_nones"),
    [
        (lambda x: x, False),
        (_hole_every(5), False),  # holes are skipped
        (_hole_every(5), True),  # ... or delivered
        (_hole_every(300), False),  # a hole now and then: runs of whole slices between
    ],
)
def test_batches_equal_a_loop_of_next(batch_size, drop_remainder, transform, allow_nones):
    ds = M.range(1000).map(transform).to_iter_dataset(allow_nones=allow_nones)
    batched = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
    assert list(batched) == _one_at_a_time(ds, batch_size, drop_remainder)


@pytest.mark.parametrize("transform", [lambda x: x, _hole_every(3)])
def test_a_state_after_every_batch_restores_exactly(transform):
    ds = M.range(90).map(transform).to_iter_dataset().batch(8, batch_fn=list)
    gm.testing.assert_equal_output_after_checkpoint(ds)


def test_a_restored_iterator_batches_from_mid_chunk():
    ds = M.range(1000).map(_hole_every(7)).to_iter_dataset().batch(10, batch_fn=list)
    it = iter(ds)
    for _ in range(13):  # mid-way through the first chunk
        next(it)
    state = it.get_state()
    rest = list(it)
    restored = iter(ds)
    restored.set_state(state)
    assert list(restored) == rest


@pytest.mark.parametrize("ratio_every", [2, 3])  # a half, a third of the elements filtered
def test_the_filter_ratio_check_raises_where_next_raises(ratio_every):
    """The holes' check counts windows of 1000 inputs: a batch whose slice crosses a
    window's end closes it there, so the check raises at the same input either way."""
    options = gm.experimental.DatasetOptions(filter_raise_threshold_ratio=0.3)
    read = M.range(5000).map(_hole_every(ratio_every)).to_iter_dataset()
    ds = gm.experimental.WithOptionsIterDataset(read, options)

    def raises_at(iterator, size):
        taken = []

        def take_all():
            for element in iterator:
                taken.append(size(element))

        with pytest.raises(ValueError, match="filter_raise_threshold_ratio"):
            take_all()
        return sum(taken), iterator.get_state()["next_index"]

    elements, position = raises_at(iter(ds), lambda _: 1)
    batches, batch_position = raises_at(iter(ds.batch(16, batch_fn=list)), len)
    assert position == batch_position == 1000
    assert batches == elements // 16 * 16  # the failing batch's elements are lost, as before


def test_arrays_pass_through_the_hole_check():
    """Holes are found by identity: arrays (whose == is element-wise) are no trouble."""
    ds = M.range(100).map(lambda x: np.full((3,), x)).to_iter_dataset().batch(10)
    batches = list(ds)
    assert [b.shape for b in batches] == [(10, 3)] * 10
    assert batches[-1][-1].tolist() == [99, 99, 99]


def test_an_error_after_some_elements_of_a_batch_raises_and_resumes_there():
    def fails_at_45(x):
        if x == 45:
            raise KeyError("element 45")
        return x

    it = iter(M.range(100).map(fails_at_45).to_iter_dataset().batch(10, batch_fn=list))
    assert [next(it) for _ in range(4)] == [list(range(i, i + 10)) for i in range(0, 40, 10)]
    with pytest.raises(KeyError, match="element 45"):
        next(it)
    assert it.get_state()["next_index"] == 45  # at the failing element, as next() leaves it


def _gristmill_calls_per_element(ds, elements):
    """Python function calls made in gristmill's code per element while iterating ``ds``
    (the user's functions, numpy and the interpreter's own do not count)."""
    calls = 0
    root = gm.__file__.rsplit("/", 1)[0]

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls += 1

    it = iter(ds)
    next(it)  # the engine's first, probing read (not what is counted)
    sys.setprofile(count)
    try:
        taken = sum(1 for _ in it)
    finally:
        sys.setprofile(None)
    assert taken > 0
    return calls / elements


def test_batching_cheap_elements_costs_no_call_per_element():
    """The per-element overhead of ``to_iter_dataset().batch()``: the batch takes its
    elements as one slice, so gristmill's own code runs per batch and per chunk (of up to
    256 elements), never once per element (a ``next()`` per element made two calls each)."""
    n = 32 * 400
    ds = M.range(n).map(lambda x: x + 1).to_iter_dataset().batch(32)
    assert _gristmill_calls_per_element(ds, n) < 1.0
