"""Grain 0.2.18's modules, and the gristmill modules that answer for each.

An alias module (``grain_alias``) named in :data:`MODULES` finds each attribute in its
gristmill modules, searched in order (public namespaces first, then the private module that
holds a same-named class); a parent package's attribute that is one of these modules is that
alias module (``grain.experimental``). The table holds Grain's public modules and the private
module paths that code written against Grain imports: Grain's own tests (run by
``tests/upstream/run_grain.py``) and the libraries that wrap Grain (Keras, MaxText,
Kauldron, AXLearn: docs/grain_wrappers.md lists what each reads).
"""

from __future__ import annotations

MODULES: dict[str, tuple[str, ...]] = {
    "grain": ("gristmill",),
    "grain.python": ("gristmill.python",),
    "grain.python.experimental": ("gristmill.python.experimental", "gristmill.experimental"),
    "grain.experimental": ("gristmill.experimental",),
    "grain.checkpoint": ("gristmill.checkpoint",),
    "grain.constants": ("gristmill.constants",),
    "grain.multiprocessing": ("gristmill.multiprocessing",),
    "grain.samplers": ("gristmill.samplers",),
    "grain.sharding": ("gristmill.sharding",),
    "grain.sources": ("gristmill.sources",),
    "grain.transforms": ("gristmill.transforms",),
    "grain._src.core.config": ("gristmill._src.core.config",),
    "grain._src.core.constants": ("gristmill.constants",),
    "grain._src.core.sharding": ("gristmill.sharding", "gristmill._src.loader.sharding"),
    "grain._src.core.transforms": ("gristmill.transforms",),
    "grain._src.core.tree_lib": ("gristmill._src.core.tree",),
    "grain._src.python.data_loader": (
        "gristmill",
        "gristmill.python",
        "gristmill._src.compat.grain_private",
    ),
    "grain._src.python.data_sources": ("gristmill.sources", "gristmill.python"),
    "grain._src.python.dataset.base": (
        "gristmill.experimental",
        "gristmill.transforms",
        "gristmill.sources",
        "gristmill._src.core.dataset_options",
        "gristmill._src.dataset.batching",
    ),
    "grain._src.python.dataset.dataset": (
        "gristmill",
        "gristmill.experimental",
        "gristmill._src.dataset.base",
        "gristmill._src.dataset.iter_base",
    ),
    "grain._src.python.dataset.elastic_iterator": ("gristmill.experimental",),
    "grain._src.python.dataset.sources.parquet_dataset": ("gristmill.experimental",),
    "grain._src.python.dataset.sources.tfrecord_dataset": (
        "gristmill.experimental",
        "gristmill._src.compat.grain_tfrecord",
    ),
    "grain._src.python.dataset.transformations.batch": (
        "gristmill.experimental",
        "gristmill._src.dataset.batching",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.cache": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.filter": (
        "gristmill._src.dataset.mapping",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.flatmap": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.interleave": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.limit": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.map": (
        "gristmill._src.dataset.mapping",
        "gristmill._src.dataset.iter_ops",
    ),
    "grain._src.python.dataset.transformations.mix": (
        "gristmill._src.dataset.combine",
        "gristmill._src.dataset.iter_mix",
    ),
    "grain._src.python.dataset.transformations.packing": (
        "gristmill.experimental",
        "gristmill._src.dataset.packing",
    ),
    "grain._src.python.dataset.transformations.packing_concat_then_split": (
        "gristmill.experimental",
    ),
    "grain._src.python.dataset.transformations.prefetch": (
        "gristmill.experimental",
        "gristmill._src.dataset.to_iter",
        "gristmill._src.dataset.prefetch",
        "gristmill._src.dataset.thread_prefetch",
    ),
    "grain._src.python.dataset.transformations.prefetch_autotune": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.process_prefetch": (
        "gristmill._src.dataset.process_prefetch",
    ),
    "grain._src.python.dataset.transformations.rebatch": ("gristmill.experimental",),
    "grain._src.python.dataset.transformations.repeat": (
        "gristmill.experimental",
        "gristmill._src.dataset.slicing",
    ),
    "grain._src.python.dataset.transformations.shuffle": (
        "gristmill.experimental",
        "gristmill._src.dataset.shuffle",
    ),
    "grain._src.python.dataset.transformations.slice": ("gristmill._src.dataset.slicing",),
    "grain._src.python.dataset.transformations.source": ("gristmill._src.dataset.source",),
    "grain._src.python.dataset.transformations.zip": ("gristmill.experimental",),
    "grain._src.python.experimental.device_put.device_put": ("gristmill.experimental",),
    "grain._src.python.experimental.example_packing.packing": ("gristmill.experimental",),
    "grain._src.python.experimental.index_shuffle.python.index_shuffle_module": (
        "gristmill.experimental",
    ),
    "grain._src.python.ipc.shared_memory_array": ("gristmill.multiprocessing",),
    "grain._src.python.load": ("gristmill",),
    "grain._src.python.operations": ("gristmill.python",),
    "grain._src.python.options": ("gristmill",),
    "grain._src.python.record": ("gristmill",),
    "grain._src.python.samplers": ("gristmill.samplers",),
    "grain._src.python.testing.experimental": ("gristmill.testing", "gristmill.experimental"),
}
"""Grain module -> the gristmill modules searched, in order, for each of its attributes."""

MODULE_ATTRIBUTES: dict[str, dict[str, str]] = {
    # Grain's modules import each other, and code reaches one through another's attribute
    "grain._src.python.dataset.transformations.batch": {
        "tree_lib": "grain._src.core.tree_lib",
        "shared_memory_array": "grain._src.python.ipc.shared_memory_array",
    },
}
"""Grain module -> {attribute: the Grain module it is}."""
