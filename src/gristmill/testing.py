"""Helpers for testing pipelines built with gristmill."""

from gristmill._src.checkpoint.testing import assert_equal_output_after_checkpoint

__all__ = ["assert_equal_output_after_checkpoint"]
