"""Training-loop conveniences: epoch-by-epoch iteration with one state, a progress meter."""
