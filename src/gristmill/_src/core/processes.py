"""The JAX process topology, when JAX is installed (0 of 1 otherwise)."""

from __future__ import annotations


def jax_process_index_and_count() -> tuple[int, int]:
    """``(jax.process_index(), jax.process_count())``, or ``(0, 1)`` without jax."""
    # Imported here: jax is optional and slow to import.
    try:
        import jax  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return 0, 1
    return int(jax.process_index()), int(jax.process_count())
