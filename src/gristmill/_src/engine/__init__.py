"""The one executor: chunked, ordered, bounded, measured (see docs/engine.md)."""
