"""Which axis of a weight FSDP splits: the one rule the layers' gathers (trainer.nn.layers) and the
run's state shardings (trainer.run.mesh) share."""

from __future__ import annotations

import math

from jax.sharding import PartitionSpec

# Arrays smaller than this stay replicated: splitting norms and biases saves nothing and costs collectives.
MIN_FSDP_ELEMENTS = 2**16


def fsdp_spec(shape: tuple[int, ...], fsdp_size: int) -> PartitionSpec:
    """Splits the largest axis that `fsdp_size` divides, for arrays worth splitting."""
    if fsdp_size == 1 or math.prod(shape) < MIN_FSDP_ELEMENTS:
        return PartitionSpec()
    for axis in sorted(range(len(shape)), key=lambda i: -shape[i]):
        if shape[axis] % fsdp_size == 0:
            return PartitionSpec(*([None] * axis + ["fsdp"]))
    return PartitionSpec()
