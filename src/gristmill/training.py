"""Training-loop conveniences: epochs with one checkpointable state, a progress meter.

``Epochs(ds, pipeline)`` iterates epoch by epoch (a new permutation each, never mixed in a
batch) and checkpoints ``(epoch, position)`` as one state; ``progress(batches)`` shows
batches/s and the share of the loop's time spent waiting for data (needs tqdm:
``pip install -e '.[progress]'`` in a checkout).
"""

from gristmill._src.public import export as _export
from gristmill._src.training.epochs import Epoch, Epochs
from gristmill._src.training.progress import ProgressMeter, StepMeter, progress

_export("gristmill.training", Epoch, Epochs, ProgressMeter, StepMeter, progress)

__all__ = ["Epoch", "Epochs", "ProgressMeter", "StepMeter", "progress"]
