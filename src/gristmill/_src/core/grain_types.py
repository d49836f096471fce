"""Base classes named as Grain's, in a module whose name says ``grain``.

Keras recognises a Grain dataset by its classes rather than by ``isinstance``
(``keras.src.trainers.data_adapters.is_grain_dataset``): a class of the object's MRO must be
named ``MapDataset``, ``IterDataset`` or ``DataLoader`` and come from a module whose name
contains ``"grain"``. gristmill's public classes report ``gristmill`` as their module, so
each has one of these empty classes as a base: ``model.fit(ds)`` then takes a gristmill
dataset for a Grain one. They add no attribute, no slot and no behaviour.
"""

from __future__ import annotations


class MapDataset:
    """The base of ``gristmill.MapDataset`` that Keras's Grain check finds."""

    __slots__ = ()


class IterDataset:
    """The base of ``gristmill.IterDataset`` that Keras's Grain check finds."""

    __slots__ = ()


class DataLoader:
    """The base of ``gristmill.DataLoader`` that Keras's Grain check finds."""

    __slots__ = ()
