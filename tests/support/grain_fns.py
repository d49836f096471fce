"""Module-level Grain transformations for parity tests that start Grain worker processes."""

import grain.python as grain


class PlusHundredGrain(grain.MapTransform):
    def map(self, x):
        return x + 100


class NotMultipleOfThreeGrain(grain.FilterTransform):
    def filter(self, x):
        return x % 3 != 0


class OddTwiceGrain(grain.experimental.FlatMapTransform):
    """``x`` once if even, ``x`` and ``x + 100`` if odd."""

    max_fan_out = 2

    def flat_map(self, x):
        return [x, x + 100][: 1 + x % 2]
