"""Grain's subclassing contract: user datasets work with every fluent method."""

import pickle

import gristmill as gm


class Squares(gm.MapDataset):
    def __init__(self, n):
        super().__init__()
        self._n = n

    def __len__(self):
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return (index % self._n) ** 2


class AddParentIndex(gm.MapDataset):
    def __init__(self, parent):
        super().__init__(parent)

    def __len__(self):
        return len(self._parent)

    def __getitem__(self, index):
        return (index, self._parent[index])


class BatchedSquares(Squares):
    def __init__(self, n):
        super().__init__(n)
        self.batched_calls = 0

    def _getitems(self, indices):
        self.batched_calls += 1
        return [(i % self._n) ** 2 for i in indices]


def test_user_map_dataset_supports_fluent_methods():
    ds = Squares(5).shuffle(42).map(lambda x: x + 1)
    assert sorted(ds[i] for i in range(5)) == [1, 2, 5, 10, 17]
    assert [b.tolist() for b in Squares(4).batch(2)] == [[0, 1], [4, 9]]
    assert list(Squares(3)) == [0, 1, 4]
    assert [Squares(6)[1:3][i] for i in range(2)] == [1, 4]


def test_user_node_in_the_middle_of_a_pipeline():
    ds = AddParentIndex(gm.MapDataset.range(10, 20).shuffle(1)).batch(5)
    first = ds[0]
    assert first[0].tolist() == [0, 1, 2, 3, 4]
    assert first[1].tolist() == [gm.MapDataset.range(10, 20).shuffle(1)[i] for i in range(5)]
    assert AddParentIndex(Squares(2)).parents[0]._n == 2


def test_user_batched_read_is_used_for_chunks():
    source = BatchedSquares(8)
    assert source.batch(4)[1].tolist() == [16, 25, 36, 49]
    assert source.batched_calls == 1


def test_user_iter_dataset_and_iterator():
    class CountIterator(gm.DatasetIterator):
        def __init__(self, stop):
            super().__init__()
            self._i = 0
            self._stop = stop

        def __next__(self):
            if self._i >= self._stop:
                raise StopIteration
            self._i += 1
            return self._i - 1

        def get_state(self):
            return {"i": self._i}

        def set_state(self, state):
            self._i = state["i"]

    class Count(gm.IterDataset):
        def __iter__(self):
            return CountIterator(4)

    it = iter(Count())
    assert next(it) == 0
    state = it.get_state()
    assert list(it) == [1, 2, 3]
    it.set_state(state)
    assert list(it) == [1, 2, 3]
    with it:
        pass
    assert Count().pipe(lambda ds: type(ds).__name__) == "Count"


class ProportionalSlice(gm.MapDataset):
    """Written against Grain: times its own index arithmetic with ``self._stats``."""

    def __init__(self, parent, fraction):
        super().__init__(parent)
        self._length = int(len(parent) * fraction)

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        with self._stats.record_self_time():
            parent_index = index % self._length
        return self._stats.record_output_spec(self._parent[parent_index])

    def _getitems(self, indices):
        with self._stats.record_self_time(num_elements=len(indices)):
            keys = [i % self._length for i in indices]
        return self._stats.record_output_spec_for_batch(self._parent._getitems(keys))


def test_user_map_dataset_records_self_time_through_stats():
    ds = ProportionalSlice(gm.MapDataset.range(10).map(lambda x: x * 3), 0.5)
    assert [ds[i] for i in range(7)] == [0, 3, 6, 9, 12, 0, 3]
    assert ds._getitems([1, 2]) == [3, 6]
    assert list(ds.to_iter_dataset()) == [0, 3, 6, 9, 12]
    assert ds._stats.num_elements >= 7 + 2
    assert ds._stats.self_time_ns >= 0


def test_stats_record_self_time_works_as_a_decorator_with_an_offset():
    ds = gm.MapDataset.range(3)

    @ds._stats.record_self_time(num_elements=2, offset_ns=1_000_000)
    def work():
        return "done"

    assert [work(), work()] == ["done", "done"]
    assert ds._stats.num_elements == 4
    assert ds._stats.self_time_ns >= 2_000_000


def test_stats_are_per_node_and_start_empty_in_a_copy_sent_to_workers():
    ds = ProportionalSlice(gm.MapDataset.range(10), 0.5)
    assert ds[0] == 0
    assert ds._stats is not ds.parents[0]._stats
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._stats.num_elements == 0
    assert [copy[i] for i in range(5)] == [0, 1, 2, 3, 4]


def test_user_iterator_records_self_time_through_stats():
    class Doubling(gm.DatasetIterator):
        def __next__(self):
            element = next(self._parent)
            with self._stats.record_self_time():
                return self._stats.record_output_spec(element * 2)

        def get_state(self):
            return self._parent.get_state()

        def set_state(self, state):
            self._parent.set_state(state)

    it = Doubling(iter(gm.MapDataset.range(4).to_iter_dataset()))
    assert list(it) == [0, 2, 4, 6]
    assert it._stats.num_elements == 4
    it._stats.report()  # nothing to report: statistics() has the engine's numbers
