"""DataLoader building blocks: sharding options and index samplers."""
