"""What Keras does to append an operation to a Grain DataLoader: build a new one from the
old one's private attributes (shared by the Keras-like stand-in and the in-process test)."""


def rebuilt_loader(grain, old, operation):
    """A ``grain.DataLoader`` like ``old``, with ``operation`` after its operations."""
    options = old._multiprocessing_options
    return grain.DataLoader(
        data_source=old._data_source,
        sampler=old._sampler,
        operations=[*old._operations, operation],
        worker_count=options.num_workers,
        worker_buffer_size=options.per_worker_buffer_size,
        shard_options=old._shard_options,
        read_options=old._read_options,
        enable_profiling=options.enable_profiling,
    )
