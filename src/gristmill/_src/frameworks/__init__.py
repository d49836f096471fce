"""Adapters from gristmill's datasets and pipelines to training frameworks (torch, jax)."""
