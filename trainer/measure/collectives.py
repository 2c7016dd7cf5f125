"""The bytes a compiled TPU program's collectives move per chip, read from its optimized HLO text.

XLA's cost analysis counts HBM bytes, not the inter-chip interconnect: an FSDP step gathers every
weight and scatters every gradient over ICI, and that traffic is what a smaller FSDP group saves.
Each collective is counted by the arrays it handles per chip: an all-gather's gathered result, a
reduce-scatter's full operand (its result times the group), an all-reduce twice (its reduce-scatter
and all-gather halves), an all-to-all's or collective-permute's result. Asynchronous pairs are
counted once, at their -done. Like the cost analysis, a loop body's collectives count once.
"""

from __future__ import annotations

import math
import re

_INSTRUCTION = re.compile(r"=\s*(?P<shapes>.+?)\s(?P<op>all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)"
                          r"(?P<phase>-start|-done)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"\b(?P<dtype>pred|bf16|f16|f32|f64|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2)\[(?P<dims>[\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
             "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_MESH_GROUP = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]\s*\{(?P<over>[^}]*)\}")
_LIST_GROUP = re.compile(r"replica_groups=\{\{(?P<first>[\d,]*)\}")


def array_bytes(shapes: str) -> int:
    return sum(_ITEMSIZE[m["dtype"]] * math.prod(int(d) for d in m["dims"].split(",") if d) for m in _ARRAY.finditer(shapes))


def _group_size(rest: str) -> int:
    """How many chips one of the collective's groups spans (its replica_groups, in either notation)."""
    if match := _MESH_GROUP.search(rest):
        sizes = {name.strip("'"): int(size) for name, size in (pair.split("=") for pair in match["axes"].split(","))}
        return math.prod(sizes[name.strip(" '")] for name in match["over"].split(",") if name.strip(" '"))
    if match := _LIST_GROUP.search(rest):
        return len(match["first"].split(","))
    return 1


def collective_bytes(hlo: str) -> int:
    """Bytes per chip that the program's collectives handle (see the module docstring)."""
    total = 0
    for line in hlo.splitlines():
        match = _INSTRUCTION.search(line)
        if match is None or match["phase"] == "-start":
            continue
        size = array_bytes(match["shapes"])
        if match["op"] == "reduce-scatter":
            size *= _group_size(match["rest"])
        elif match["op"] == "all-reduce":
            size *= 2
        total += size
    return total
