"""Where a train step's time goes, from a profiler trace of a few steps: a table of time per category.

`python -m trainer.measure.step_profile TRACE_DIR --hlo STEP.hlo --steps N [--step-s S]` prints it for a
trace that `--profile-dir` wrote (the run also prints it itself when the trace ends); `bench.device --profile`
prints it for each side it measures.

Each operation the device ran is named in the trace by its HLO instruction; the compiled step's HLO says
what that instruction is (trainer.measure.hbm_traffic.parse), what JAX operation it came from (its
op_name: a layer, forward or backward, or outside the model) and, where the HLO text holds its stack
frames, which of the step's own functions. Categories, first match wins: the attention kernel (a custom
call in an attention layer, or named as splash's and our flash kernels' calls are); by the step's code
(stack frames): the weight casts (trainer.run.step.forward_params, which casts the float32 weights to
the compute dtype, and its transpose, which casts their gradients back), the optimizer update
(trainer/run/optimizer.py), the metrics (the step's train function outside the loss and optimizer: the
gradients' norm, the token count); without frames, a lone conversion outside the model is a weight
cast; the loss head (forward or backward outside the model's layers); "other" for the rest named
outside the model; then by what the instruction is: collectives, matmuls (a convolution or dot, fused
or not), copies and transposes, elementwise and reductions. Host gaps are the measured step's time the
device spent idle, where the step's time is given and the trace holds a device: operations on its
timeline that the step's HLO does not name (another program's) are busy time, in a row of their own,
not gaps (on the CPU, operations run on several threads at once, so shares are of the operations'
summed time, another program's left out, and there is no gap). Where the trace gives an operation's
FLOPs or bytes (the TPU's does), the table shows the rate each category achieved.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
import re
import sys

from trainer.errors import UserError
from trainer.measure import hbm_traffic
from trainer.run.mesh import jax_entry_point

CATEGORIES = ("matmuls", "attention kernel", "weight casts", "loss head", "optimizer update", "metrics", "collectives",
              "copies and transposes", "elementwise and reductions", "other")
HOST_GAPS = "host gaps (device idle)"
OTHER = "other"  # named outside the model, and none of the above
NOT_IN_STEP = "other programs' operations"  # on the device's timeline, not the step's HLO: busy, not idle
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all", "collective-broadcast")
_MATMULS = ("convolution", "dot")
_MOVES = {"copy", "transpose", "copy-start", "copy-done", "bitcast", "reshape", "broadcast", "parameter", "tuple",
          "get-tuple-element", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad"}
_CONTROL = {"while", "call", "conditional"}
_KERNEL_NAMES = ("splash_", "flash_")
# Stats a TPU trace attaches to an operation's event, when it does.
_FLOPS_STATS, _BYTES_STATS = ("flops", "model_flops"), ("bytes_accessed", "bytes accessed")


@dataclasses.dataclass(frozen=True)
class OpEvent:
    name: str  # the HLO instruction
    duration_ns: float
    flops: float | None = None
    bytes: float | None = None


_TABLE_ROW = re.compile(r"^(?P<id>\d+) (?P<value>.*)$")
_FIELD = re.compile(r"(?P<key>\w+)=(?P<value>\d+)")
_FRAME_ID = re.compile(r"\bstack_frame_id=(?P<id>\d+)")
_CASTS = {"convert", "parameter", "bitcast", "copy", "reshape", "transpose", "tuple", "get-tuple-element"}


def stack_frames(hlo: str) -> dict[int, list[tuple[str, str]]]:
    """Stack frame id -> its (file, function) pairs, innermost first, from the tables the HLO text opens
    with (FileNames, FunctionNames, FileLocations, StackFrames); {} where it has none."""
    tables, current = collections.defaultdict(dict), None
    for line in hlo.splitlines():
        if line.startswith(("%", "ENTRY")):
            break
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = line
        elif current and (row := _TABLE_ROW.match(line)):
            value = row["value"]
            tables[current][int(row["id"])] = value.strip('"') if value.startswith('"') else dict(
                (field["key"], int(field["value"])) for field in _FIELD.finditer(value))
    files, functions, locations, frames = (tables[name] for name in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"))
    chains = {}
    for frame_id in frames:
        chain, seen, current_id = [], set(), frame_id
        while current_id in frames and current_id not in seen:
            seen.add(current_id)
            location = locations.get(frames[current_id].get("file_location_id"), {})
            chain.append((files.get(location.get("file_name_id"), ""), functions.get(location.get("function_name_id"), "")))
            current_id = frames[current_id].get("parent_frame_id")
        chains[frame_id] = chain
    return chains


def categories(hlo: str) -> dict[str, str]:
    """HLO instruction name -> its category, for every instruction of the compiled program (None: control
    flow, whose time its body's operations carry)."""
    computations, _ = hbm_traffic.parse(hlo)
    frames = stack_frames(hlo)
    ops_in = {name: {instruction.op for instruction in body} for name, body in computations.items()}
    found = {}
    for body in computations.values():
        for instruction in body:
            callee = hbm_traffic.called(instruction, "calls")
            inner = ops_in.get(callee, set()) if callee else set()
            frame = _FRAME_ID.search(instruction.attributes)
            found[instruction.name] = _category(instruction, inner, frames.get(int(frame["id"]), []) if frame else [])
    return found


def _by_frames(instruction: hbm_traffic.Instruction, frames: list[tuple[str, str]]) -> str | None:
    """The step's own code an instruction came from, by the innermost of the trainer's frames: the weights'
    cast to the compute dtype (trainer.run.step.forward_params; its transpose casts their gradients back),
    the optimizer (trainer/run/optimizer.py), the step's metrics (its train function outside the loss)."""
    ours = [(file, function) for file, function in frames if "/trainer/" in file]
    if not ours:
        # An optax transformation the trainer calls (float32 AdamW is optax's chain): the HLO's frames may stop at
        # its innermost function, without the trainer's caller.
        return "optimizer update" if frames and "/optax/" in frames[0][0] else None
    file, function = ours[0]
    if any("forward_params" in name for _, name in ours):
        return "weight casts"
    if file.endswith("/run/optimizer.py"):
        return "optimizer update"
    if file.endswith("/run/step.py") and function.split(".")[-1] == "train" and hbm_traffic.source(instruction) == "optimizer":
        return "metrics"
    return None


def _category(instruction: hbm_traffic.Instruction, inner: set[str], frames: list[tuple[str, str]] = ()) -> str | None:
    """None for control flow (a loop's, a call's event spans its body's operations, counted themselves)."""
    if instruction.op in _CONTROL:
        return None
    source = hbm_traffic.source(instruction)
    # Splash's calls carry no op_name: their own names say what they are (splash_mha_fwd_..., _dq_, _dkv_).
    if instruction.op == "custom-call" and (source.endswith(" attn") or instruction.name.startswith(_KERNEL_NAMES)):
        return "attention kernel"
    if placed := _by_frames(instruction, list(frames)):
        return placed
    # Without stack frames: a conversion alone (fused with data movement only) outside the model is a weight's cast.
    if (source.endswith("loss head") and instruction.attributes.count("convert_element_type")
            and (instruction.op == "convert" or (inner and "convert" in inner and inner <= _CASTS))):
        return "weight casts"
    if source.endswith("loss head"):
        return "loss head"
    if source == "optimizer":  # named outside the model, neither forward nor backward, not placed above
        return OTHER
    if any(instruction.op.startswith(name) for name in _COLLECTIVES) or inner & set(_COLLECTIVES):
        return "collectives"
    if instruction.op in _MATMULS or inner & set(_MATMULS):
        return "matmuls"
    if instruction.op in _MOVES or (inner and inner <= _MOVES):
        return "copies and transposes"
    return "elementwise and reductions"


def _instruction_name(event_name: str) -> str:
    """A TPU trace names an operation by its HLO text ("%fusion.3 = bf16[...] fusion(...)"), the CPU's by
    its name alone."""
    name = event_name.split(" = ", 1)[0] if " = " in event_name else event_name
    return name.lstrip("%").strip()


def _stat(stats: dict, names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in stats:
            try:
                return float(stats[name])
            except (TypeError, ValueError):
                return None
    return None


def newest_trace(trace_dir: str) -> pathlib.Path:
    traces = sorted(pathlib.Path(trace_dir).rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise UserError(f"{trace_dir}: no profiler trace (*.xplane.pb) under it; --profile-dir writes one")
    return traces[-1]


def read_trace(path: pathlib.Path) -> tuple[list[OpEvent], bool]:
    """(the operations the device ran, whether they came from an accelerator's own timeline). On an
    accelerator: its first device's "XLA Ops" line; on the CPU: the host's events that name an HLO op."""
    import jax

    data = jax.profiler.ProfileData.from_file(str(path))
    devices = sorted((plane for plane in data.planes if plane.name.startswith("/device:") and "CUSTOM" not in plane.name),
                     key=lambda plane: plane.name)
    for plane in devices:
        for line in plane.lines:
            if line.name == "XLA Ops":
                events = [OpEvent(_instruction_name(event.name), event.duration_ns, _stat(dict(event.stats), _FLOPS_STATS),
                                  _stat(dict(event.stats), _BYTES_STATS)) for event in line.events]
                if events:
                    return events, True
    events = []
    for plane in data.planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                for event in line.events:
                    stats = dict(event.stats)
                    if "hlo_op" in stats:
                        events.append(OpEvent(str(stats["hlo_op"]), event.duration_ns))
    return events, False


@dataclasses.dataclass(frozen=True)
class Row:
    category: str
    ms_per_step: float
    share: float  # of the step (or of the operations' time, where there is no device timeline)
    tflops_per_s: float | None = None
    gbytes_per_s: float | None = None


def step_table(events: list[OpEvent], by_name: dict[str, str], *, steps: int, step_s: float | None,
               device_timeline: bool) -> list[Row]:
    """Rows per category, largest first, then the host gaps (device timeline and step time known).
    Operations the step's HLO does not name (another program's) and control flow are left out."""
    time, flops, moved = collections.Counter(), collections.Counter(), collections.Counter()
    for event in events:
        if event.name not in by_name:
            if not device_timeline:
                continue  # the host's threads: another program's work is not the step's
            category = NOT_IN_STEP  # the device was busy with it: not a gap
        elif (category := by_name[event.name]) is None:
            continue  # control flow: its body's operations carry its time
        time[category] += event.duration_ns
        flops[category] += event.flops or 0
        moved[category] += event.bytes or 0
    busy_ms = sum(time.values()) / 1e6 / steps
    whole_ms = step_s * 1e3 if (device_timeline and step_s) else busy_ms
    rows = []
    for category, ns in time.most_common():
        seconds = ns / 1e9
        rows.append(Row(category, ns / 1e6 / steps, ns / 1e6 / steps / whole_ms if whole_ms else 0.0,
                        flops[category] / seconds / 1e12 if flops[category] and seconds else None,
                        moved[category] / seconds / 1e9 if moved[category] and seconds else None))
    if device_timeline and step_s:
        gap = max(whole_ms - busy_ms, 0.0)
        rows.append(Row(HOST_GAPS, gap, gap / whole_ms))
    return rows


def format_table(rows: list[Row], *, title: str) -> str:
    lines = [title, f"  {'category':<28} {'ms/step':>9} {'share':>7} {'TFLOP/s':>9} {'GB/s':>8}"]
    for row in rows:
        rate = lambda value: f"{value:9.1f}" if value is not None else f"{'-':>9}"  # noqa: E731
        lines.append(f"  {row.category:<28} {row.ms_per_step:9.2f} {row.share:7.1%} {rate(row.tflops_per_s)} "
                     f"{rate(row.gbytes_per_s)[1:]}")
    return "\n".join(lines)


def profile_table(trace_dir: str, hlo: str, *, steps: int, step_s: float | None = None) -> list[Row]:
    """The table of the newest trace under `trace_dir`, read against the step's compiled HLO text."""
    events, device_timeline = read_trace(newest_trace(trace_dir))
    return step_table(events, categories(hlo), steps=steps, step_s=step_s, device_timeline=device_timeline)


@jax_entry_point("trainer.measure.step_profile: ")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.measure.step_profile", description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir", help="a --profile-dir (the newest *.xplane.pb under it is read)")
    parser.add_argument("--hlo", required=True, help="the compiled train step's HLO text (a run writes WORKDIR/step.hlo)")
    parser.add_argument("--steps", type=int, required=True, help="train steps the trace holds")
    parser.add_argument("--step-s", type=float, help="the measured seconds a step, for the host gaps")
    args = parser.parse_args(argv)
    try:
        hlo = pathlib.Path(args.hlo).read_text()
    except OSError as error:
        raise UserError(f"--hlo {args.hlo}: {error.strerror}") from None
    print(format_table(profile_table(args.trace_dir, hlo, steps=args.steps, step_s=args.step_s),
                       title=f"where the step's time goes ({args.trace_dir})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
