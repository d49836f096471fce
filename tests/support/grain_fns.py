"""Module-level Grain transformations for parity tests that start Grain worker processes."""

import grain.python as grain


class PlusHundredGrain(grain.MapTransform):
    def map(self, x):
        return x + 100
