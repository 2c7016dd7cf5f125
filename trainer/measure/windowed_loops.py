"""The FLOPs XLA's cost analysis leaves out of FSDP's matmuls, read from the optimized HLO text.

With weights split over the FSDP group, XLA's SPMD partitioner writes a large matmul as a loop
(`windowed_dot_general`): each iteration multiplies the shard at hand while the next one moves over
ICI. The cost analysis counts a loop body once, so such a step reports a fraction of its matmul FLOPs
(gemma3-270m at 128 x 256 on v6e 2x4, FSDP over 8: 0.82x of the model's count). This adds the
missing (trips - 1) iterations of each such loop: the trips are read from the loop itself (its
condition's bound, its counter's start and step), the FLOPs of its body from its convolutions and
dots (2 per multiply-add of the output with the contracted dimensions).
"""

from __future__ import annotations

import math
import re

from trainer.measure import hbm_traffic

_WINDOWED = "windowed_dot_general"
_DIMS = re.compile(r"\[([\d,]*)\]")
_INDEX = re.compile(r"\bindex=(\d+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_WINDOW_FIELD = re.compile(r"(\w+)=([-\d_x]+)")


def _dims(shape: str) -> list[int]:
    match = _DIMS.search(shape)
    return [int(size) for size in match[1].split(",") if size] if match else []


def missing_flops(hlo: str) -> float:
    """FLOPs per chip of the windowed matmul loops' iterations the cost analysis did not count."""
    computations, entry = hbm_traffic.parse(hlo)
    named = {instruction.name: instruction for instructions in computations.values() for instruction in instructions}
    missing = 0.0
    for instruction, times in hbm_traffic.runs(computations, entry):
        body = hbm_traffic.called(instruction, "body") if instruction.op == "while" else None
        if body and _WINDOWED in body:
            trips = _trips(instruction, computations, named)
            missing += times * (trips - 1) * _flops(body, computations, named)
    return missing


def _trips(loop, computations, named) -> int:
    """Iterations of a counted loop: its condition is `counter < bound`, its body adds a constant step to
    the counter (its root tuple's element), and the counter starts at a constant (0 when it is not one)."""
    condition = computations[hbm_traffic.called(loop, "condition")]
    compare = next(instruction for instruction in condition if instruction.op == "compare")
    counter, bound = (named[name] for name in compare.operands)
    index = int(_INDEX.search(counter.attributes)[1])
    update = named[computations[hbm_traffic.called(loop, "body")][-1].operands[index]]
    steps = [_constant(named[name], named) for name in update.operands] if update.op == "add" else []
    step = next((value for value in steps if value), 1)
    initial = named[loop.operands[0]]
    start = _constant(named[initial.operands[index]], named) if initial.op == "tuple" else None
    limit = _constant(bound, named)
    return 1 if limit is None else max(math.ceil((limit - (start or 0)) / step), 1)  # 1: unknown, nothing added


def _constant(instruction, named) -> int | None:
    """The integer a constant (or a copy of one) holds; None for anything else."""
    while instruction.op == "copy":
        instruction = named[instruction.operands[0]]
    return int(instruction.arguments) if instruction.op == "constant" and instruction.arguments.lstrip("-").isdigit() else None


def _flops(computation: str, computations, named) -> float:
    """The matmul FLOPs of one run of `computation`, with the computations its fusions and calls run."""
    total = 0.0
    for instruction in computations.get(computation, ()):
        if instruction.op == "convolution":
            total += _convolution_flops(instruction, named)
        elif instruction.op == "dot":
            lhs = _dims(named[instruction.operands[0]].result)
            contracting = _CONTRACTING.search(instruction.attributes)
            contracted = math.prod(lhs[int(dim)] for dim in contracting[1].split(",") if dim) if contracting else 1
            total += 2 * math.prod(_dims(instruction.result)) * contracted
        for kind in ("calls", "to_apply"):
            if callee := hbm_traffic.called(instruction, kind):
                total += _flops(callee, computations, named)
    return total


def _convolution_flops(convolution, named) -> float:
    """2 per multiply-add, counting only the window's taps that land on the input, not on its padding
    (XLA writes some matmuls as convolutions over a padded window, e.g. gate and up stacked)."""
    lhs_labels, rhs_labels, out_labels = _DIM_LABELS.search(convolution.attributes).groups()
    lhs, rhs, out = (_dims(named[convolution.operands[0]].result), _dims(named[convolution.operands[1]].result),
                     _dims(convolution.result))
    window = dict(_WINDOW_FIELD.findall(_WINDOW.search(convolution.attributes)[1])) if "window=" in convolution.attributes else {}
    per_dim = {field: value.split("x") for field, value in window.items()}
    taps = 1
    for d in range(len(per_dim.get("size", ()))):
        low = int(per_dim["pad"][d].split("_")[0]) if "pad" in per_dim else 0
        stride = int(per_dim["stride"][d]) if "stride" in per_dim else 1
        lhs_dilation = int(per_dim["lhs_dilate"][d]) if "lhs_dilate" in per_dim else 1
        rhs_dilation = int(per_dim["rhs_dilate"][d]) if "rhs_dilate" in per_dim else 1
        size = lhs[lhs_labels.index(str(d))]
        dilated = (size - 1) * lhs_dilation + 1
        taps *= sum(1 for position in range(out[out_labels.index(str(d))]) for tap in range(rhs[rhs_labels.index(str(d))])
                    if 0 <= (at := position * stride + tap * rhs_dilation - low) < dilated and at % lhs_dilation == 0)
    spatial_out = math.prod(out[out_labels.index(str(d))] for d in range(len(per_dim.get("size", ()))))
    return 2 * math.prod(out) / spatial_out * rhs[rhs_labels.index("i")] * taps
