"""Sharding options: which part of a data source each process reads."""

from gristmill._src.loader.sharding import NoSharding, ShardByJaxProcess, ShardOptions
from gristmill._src.public import export as _export

_export("gristmill.sharding", ShardOptions, NoSharding, ShardByJaxProcess)

__all__ = ["ShardOptions", "NoSharding", "ShardByJaxProcess"]
