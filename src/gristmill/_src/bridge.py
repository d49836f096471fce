"""A stage pipeline as an ``IterDataset``: it composes with the dataset API and checkpoints.

``PipelineIterDataset(builder, num_threads=8)`` iterates a pipeline built from ``builder``
(a ``PipelineBuilder`` with its sink set, or a ``PipelineConfig``); its iterator's state is
the pipeline's (``Pipeline.get_state()``), so ``.batch(…)``, ``ThreadPrefetchIterDataset``,
``CheckpointHandler`` and ``assert_equal_output_after_checkpoint`` work on it, and a restore
continues exactly — in input order — under any concurrency.
"""

from __future__ import annotations

from typing import Any

from gristmill._src.dataset.iter_base import DatasetIterator, IterDataset
from gristmill._src.engine.plan import Plan
from gristmill._src.spdl import defs
from gristmill._src.spdl.builder import PipelineBuilder, build_pipeline
from gristmill._src.spdl.pipeline import Pipeline


class PipelineIterDataset(IterDataset[Any]):
    """An IterDataset over a stage pipeline; each ``iter()`` builds a fresh pipeline."""

    def __init__(self, pipeline: PipelineBuilder | defs.PipelineConfig, **build_kwargs: Any):
        super().__init__()
        if isinstance(pipeline, PipelineBuilder):
            pipeline = pipeline.get_config()
        if not isinstance(pipeline, defs.PipelineConfig):
            raise TypeError(
                f"pipeline must be a PipelineBuilder (with add_sink) or a PipelineConfig, got "
                f"{pipeline!r}"
            )
        if "num_threads" not in build_kwargs:
            raise TypeError("PipelineIterDataset needs num_threads=…, as PipelineBuilder.build")
        if not isinstance(pipeline.src, defs.SourceConfig) or pipeline.src.continuous:
            raise ValueError(
                "a continuous source (or a Merge of pipelines) has no state yet: build the "
                "pipeline from a non-continuous source (one epoch) for a PipelineIterDataset"
            )
        self._config = pipeline
        self._build_kwargs = build_kwargs

    def __iter__(self) -> PipelineDatasetIterator:
        return PipelineDatasetIterator(self._config, self._build_kwargs)

    def __str__(self) -> str:
        return f"PipelineIterDataset({len(self._config.pipes)} stages)"


class PipelineDatasetIterator(DatasetIterator[Any]):
    """Iterates a pipeline; its state is the pipeline's."""

    def __init__(self, config: defs.PipelineConfig, build_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._config = config
        self._build_kwargs = build_kwargs
        self._running: Pipeline = build_pipeline(config, **build_kwargs)

    def __next__(self) -> Any:
        self._check_open()
        try:
            return self._running.get_item()
        except EOFError:
            raise StopIteration from None

    def get_state(self) -> dict[str, Any]:
        return self._export_state(self._running.get_state())

    def set_state(self, state: dict[str, Any]) -> None:
        state = self._import_state(state)
        self._running.stop()
        pipeline = build_pipeline(self._config, **self._build_kwargs)
        pipeline.set_state(state)
        self._running = pipeline

    def _describe(self) -> str:
        names = [getattr(stage, "name", type(stage).__name__) for stage in self._config.pipes]
        return f"pipeline({', '.join(names)})"

    def start_prefetch(self) -> None:
        self._check_open()
        if not self._running.started:
            self._running.start()

    def plan(self) -> Plan:
        """The running pipeline's plan (``Pipeline.plan``)."""
        return self._running.plan()

    def close(self) -> None:
        try:
            if not self._closed:
                self._running.stop()
        finally:  # upstream too, when Ctrl-C cut the pipeline's stop short
            super().close()
