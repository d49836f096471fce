"""Inter-process helpers: shared-memory arrays and data sources."""
