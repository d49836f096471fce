"""Sources with a batched read are asked once per chunk, not once per element."""

import pytest

import gristmill as gm

M = gm.MapDataset


class CountingSource:
    """A random-access source that records how it is read."""

    def __init__(self, n, batched_name=None):
        self._n = n
        self.single_reads = 0
        self.batched_reads = []
        if batched_name is not None:
            setattr(self, batched_name, self._batched)

    def __len__(self):
        return self._n

    def __getitem__(self, index):
        self.single_reads += 1
        return index * 10

    def _batched(self, indices):
        self.batched_reads.append(list(indices))
        return [i * 10 for i in indices]


@pytest.mark.parametrize("name", ["_getitems", "__getitems__"])
def test_batch_reads_the_source_once_per_batch(name):
    source = CountingSource(100, name)
    ds = M.source(source).shuffle(3).map(lambda x: x + 1).batch(10)
    batches = [ds[i] for i in range(len(ds))]
    assert source.single_reads == 0
    assert len(source.batched_reads) == 10
    assert all(len(r) == 10 for r in source.batched_reads)
    assert sorted(int(x) for b in batches for x in b) == [i * 10 + 1 for i in range(100)]


def test_iteration_reads_in_chunks():
    source = CountingSource(1000, "_getitems")
    assert list(M.source(source).map(lambda x: x // 10)) == list(range(1000))
    # The engine reads the first element alone to measure its cost, then reads chunks. On a
    # loaded machine that first read can look slow (>= 1 ms), and one more element is read
    # alone on a worker thread before the cheap cost is known: a handful at most.
    # (A read stage that times its ops reads that element as a batch of one.)
    alone = source.single_reads + sum(len(r) == 1 for r in source.batched_reads)
    assert alone <= 4
    assert source.single_reads + sum(len(r) for r in source.batched_reads) == 1000
    assert sum(len(r) > 1 for r in source.batched_reads) < 20


def test_mixed_and_concatenated_sources_are_read_per_chunk():
    a, b = CountingSource(50, "_getitems"), CountingSource(50, "_getitems")
    mixed = M.mix([M.source(a), M.source(b)], [1, 3]).batch(20)
    concatenated = M.concatenate([M.source(a), M.source(b)]).batch(20)
    mixed[0], concatenated[2]
    assert a.single_reads == b.single_reads == 0
    assert len(a.batched_reads) == 2
    assert len(b.batched_reads) == 2


def test_getitems_public_batched_read_matches_single_reads():
    ds = M.range(20).shuffle(5).map(lambda x: x * 3).filter(lambda x: x % 2 == 0)
    indices = [0, 5, 19, 20, -1, 57]
    assert ds._getitems(indices) == [ds[i] for i in indices]


def test_source_without_batched_read_is_read_element_wise():
    source = CountingSource(10)
    assert M.source(source).batch(5)[1].tolist() == [50, 60, 70, 80, 90]
    assert source.single_reads == 5
