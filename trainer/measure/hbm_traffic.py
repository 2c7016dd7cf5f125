"""Where a compiled program's HBM bytes go, read from its optimized HLO text.

The compiler's cost analysis gives one figure for the bytes a step moves; the roofline says whether
they bind it. To know what to change, this splits them by instruction: every instruction that runs
(the entry computation's, and each loop body's times its known trip count) counts the bytes of its
operands and its result, as the cost analysis counts them; a fusion's internals stay on chip, so a
fusion counts only its own operands and result. An asynchronous pair counts once, at its -done (with
the -start's operands). Each instruction is named by the JAX operation it came from (its metadata
op_name): the layer's module (attn, mlp, a norm), forward or backward, or the loss head and the
optimizer outside the model; what XLA adds itself (copies, collectives) carries no name. A part of
an array counts as that part: a slice (also fused, or asynchronous into on-chip memory) reads only
the slice, and a fusion that updates a buffer in place (a dynamic-update-slice root, as XLA splits a
large matmul's output) writes only the update. An array whose layout names another memory space than
the default one is not in HBM and moves no HBM bytes: on TPU, S(1) is the chip's on-chip vector memory
(VMEM), where XLA keeps small operands and prefetches slices of large ones (`bf16[8,128]{1,0:T(8,128)S(1)}`),
so a prefetch into it reads its slice from HBM once and writes nothing there, and what reads the
prefetched copy reads no HBM. The cost analysis counts those operands as HBM bytes, and so did this
split (a weight prefetched in slices and put together on chip counted 4x, then its matmul's read): on a
gemma3-1b-width LoRA feed-forward (8,192 tokens, forward and backward) compiled for one v5e chip, this
count is 2.46 GB, the cost analysis's 3.18 GB, the split's own before it left them out 3.04 GB; where
the roofline's bytes bound took the cost analysis's figure, LoRA's measured step beat its "bound". Tile
padding is not counted, so the split's total beside the cost analysis's says how much that matters
(gemma3-1b at 8,192 tokens: 0.95x, before on-chip operands were left out).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from trainer.measure.collectives import _ARRAY, _ITEMSIZE  # the array shapes of HLO text, and their dtypes' sizes

_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+) = ")
_OPERAND = re.compile(r"%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
_LAYER = re.compile(r"/layer_\d+/(?P<module>[\w]+)")
# Instructions that move no bytes of their own: values passed around, or computations counted where they run.
UNNAMED = "no source (XLA's own copies and collectives)"
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional", "after-all",
         "partition-id", "replica-id", "opt-barrier", "iota"}
_SLICES = {"slice", "dynamic-slice"}
# An array's shape and its layout: "bf16[8,128]{1,0:T(8,128)(2,1)S(1)}" (memory space 1); no S(...) is HBM.
_LAYOUT = re.compile(r"\{(?P<layout>[^{}]*)\}")
_MEMORY_SPACE = re.compile(r"S\((?P<space>\d+)\)")


def _arrays(shapes: str):
    """(bytes, in HBM) for each array of a shape text (one array, or a tuple's)."""
    for match in _ARRAY.finditer(shapes):
        size = _ITEMSIZE[match["dtype"]] * math.prod(int(d) for d in match["dims"].split(",") if d)
        layout = _LAYOUT.match(shapes, match.end())
        space = _MEMORY_SPACE.search(layout["layout"]) if layout else None
        yield size, space is None or space["space"] == "0"


def array_bytes(shapes: str) -> int:
    """Bytes of the arrays of a shape text, wherever they live."""
    return sum(size for size, _ in _arrays(shapes))


def hbm_bytes(shapes: str) -> int:
    """Bytes of the arrays of a shape text that live in HBM (not in another memory space, such as S(1))."""
    return sum(size for size, in_hbm in _arrays(shapes) if in_hbm)


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    op: str
    result: str  # its shape text
    operands: tuple[str, ...]
    attributes: str
    arguments: str = ""  # the text between the op's parentheses (a parameter's index)


def _closing(text: str, start: int) -> int:
    """The index just past the parenthesis that closes the one at `start`."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    raise ValueError(f"unbalanced parentheses: {text[start:start + 80]}")


def _instruction(line: str) -> Instruction | None:
    match = _DEFINITION.match(line)
    if match is None:
        return None
    rest = line[match.end():]
    if rest.startswith("("):  # a tuple's shape
        end = _closing(rest, 0)
        result, rest = rest[:end], rest[end:].lstrip()
    else:
        result, _, rest = rest.partition(" ")
    op, paren, _ = rest.partition("(")
    if not paren:
        return None
    end = _closing(rest, len(op))
    arguments = rest[len(op):end]
    return Instruction(match["name"], op, result, tuple(_OPERAND.findall(arguments)), rest[end:], arguments[1:-1])


def parse(hlo: str) -> tuple[dict[str, list[Instruction]], str]:
    """(computation name -> its instructions, the entry computation's name)."""
    computations, entry, current = {}, "", None
    for line in hlo.splitlines():
        if current is None:
            if header := _HEADER.match(line):
                current = computations.setdefault(header["name"], [])
                entry = header["name"] if header["entry"] else entry
        elif line.strip() == "}":
            current = None
        elif instruction := _instruction(line):
            current.append(instruction)
    return computations, entry


def called(instruction: Instruction, name: str) -> str | None:
    match = re.search(rf"\b{name}=%([\w.\-]+)", instruction.attributes)
    return match[1] if match else None


def runs(computations: dict[str, list[Instruction]], entry: str):
    """(instruction, times it runs per step) for every instruction of the computations that run."""
    pending = [(entry, 1)]
    while pending:
        name, times = pending.pop()
        for instruction in computations.get(name, ()):
            if instruction.op == "while":
                trips = _TRIP_COUNT.search(instruction.attributes)
                pending += [(called(instruction, "body"), times * (int(trips[1]) if trips else 1))]
            elif instruction.op == "call":
                pending += [(called(instruction, "to_apply"), times)]
            yield instruction, times


def source(instruction: Instruction) -> str:
    """What JAX operation the instruction came from: "forward mlp", "backward attn", "optimizer", ..."""
    match = _OP_NAME.search(instruction.attributes)
    if match is None or not match["op_name"]:
        return UNNAMED
    op_name = match["op_name"]
    direction = "backward" if "transpose(" in op_name else "forward"
    if layer := _LAYER.search(op_name):
        return f"{direction} {layer['module']}"
    if "Transformer" in op_name:
        return f"{direction} embedding and final norm"
    if "jvp(" in op_name or "transpose(" in op_name:
        return f"{direction} loss head"
    return "optimizer"


@dataclasses.dataclass(frozen=True)
class _Access:
    """What a fused computation touches of its operands and result, where it is less than whole."""

    reads: dict[int, int]  # parameter index -> bytes read, for a parameter only sliced (or updated in place)
    writes: int | None  # bytes written, when the root updates parameters in place (dynamic-update-slice)


def _fusion_access(body: list[Instruction]) -> _Access:
    by_name = {instruction.name: instruction for instruction in body}
    users = collections.defaultdict(list)
    for instruction in body:
        for name in instruction.operands:
            users[name].append(instruction)
    root = body[-1]
    outputs = [by_name[name] for name in root.operands if name in by_name] if root.op == "tuple" else [root]
    in_place = {out.operands[0]: out for out in outputs if out.op == "dynamic-update-slice" and out.operands
                and out.operands[0] in by_name and by_name[out.operands[0]].op == "parameter"}
    reads = {}
    for parameter in (instruction for instruction in body if instruction.op == "parameter"):
        uses = users[parameter.name]
        if parameter.name in in_place and uses == [in_place[parameter.name]]:
            reads[int(parameter.arguments)] = 0  # the part not updated stays where it is
        elif uses and all(use.op in _SLICES and use.operands[0] == parameter.name for use in uses):
            reads[int(parameter.arguments)] = sum(array_bytes(use.result) for use in uses)
    writes = None
    if in_place:
        updates = in_place.values()
        writes = sum(array_bytes(by_name[out.operands[1]].result if out in updates else out.result) for out in outputs)
    return _Access(reads, writes)


def traffic(hlo: str) -> list[tuple[Instruction, int]]:
    """(instruction, HBM bytes it moves per step) for each instruction that moves any."""
    computations, entry = parse(hlo)
    by_name = {instruction.name: instruction for body in computations.values() for instruction in body}
    accesses: dict[str, _Access] = {}

    def whole(name: str) -> int:
        """The HBM bytes of an operand read whole (none where it lives on chip; a tuple's are read where taken apart)."""
        return hbm_bytes(by_name[name].result) if name in by_name and not by_name[name].result.startswith("(") else 0

    def in_hbm(name: str) -> bool:
        return name in by_name and hbm_bytes(by_name[name].result) > 0

    def size(name: str) -> int:
        return array_bytes(by_name[name].result) if name in by_name else 0

    def moved_by(instruction: Instruction) -> int:
        written = hbm_bytes(instruction.result)
        if instruction.op in _SLICES:  # the part read (where its array is in HBM), written
            return array_bytes(instruction.result) * in_hbm(instruction.operands[0]) + written
        if instruction.op == "slice-done":  # the same, asynchronously: often a prefetch into on-chip memory
            sources = [name for start in instruction.operands if start in by_name for name in by_name[start].operands[:1]]
            return array_bytes(instruction.result) * any(in_hbm(name) for name in sources) + written
        if instruction.op == "dynamic-update-slice":  # the update read, written in place
            return whole(instruction.operands[1]) + size(instruction.operands[1]) * in_hbm(instruction.operands[0])
        if instruction.op.endswith("-done"):
            return sum(whole(name) for start in instruction.operands if start in by_name
                       for name in by_name[start].operands) + written
        operands = [whole(name) for name in instruction.operands]
        if instruction.op == "fusion" and (callee := called(instruction, "calls")) in computations:
            access = accesses.setdefault(callee, _fusion_access(computations[callee]))
            operands = [access.reads.get(index, read) if read else 0 for index, read in enumerate(operands)]
            written = written if access.writes is None or not written else access.writes
        return sum(operands) + written

    moved = []
    for instruction, times in runs(computations, entry):
        if instruction.op in _FREE or instruction.op.endswith("-start"):
            continue
        moved.append((instruction, times * moved_by(instruction)))
    return moved


def by_source(hlo: str) -> dict[str, int]:
    """Bytes per step by source(), largest first."""
    totals = collections.Counter()
    for instruction, size in traffic(hlo):
        totals[source(instruction)] += size
    return dict(totals.most_common())


def total(hlo: str) -> int:
    """HBM bytes per step of the whole program: what the roofline's bytes bound divides by the bandwidth."""
    return sum(size for _, size in traffic(hlo))
