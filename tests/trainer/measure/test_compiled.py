"""The trainer's step compiled for TPU slices on this CPU host (libtpu, no TPU): the figures are there
and agree with the analytic count, a batch far too large is refused by the compiler, multislice
compiles, and a topology the compiler does not know is one line."""

import dataclasses
import types

import jax
import pytest

from trainer.model import models
from trainer.run import hbm, step
from trainer.config import TrainConfig
from trainer.errors import UserError
from trainer.measure import compiled, flops

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")

VOCAB = 512
# One policy, so that each test compiles its step once (test_remat_auto_takes_the_fastest_by_the_compilers_figures: auto).
TINY = TrainConfig(model="tiny", weights="random", batch_size=8, seq_len=256, steps=10, remat="none")
GIB = 2**30


@pytest.fixture(scope="module")
def model_config():
    return models.model_config("tiny", vocab_size=VOCAB)


@pytest.fixture(scope="module")
def v6e_2x2():
    return compiled.tpu_devices("v6e", "2x2")


@pytest.fixture(scope="module")
def tiny_step(model_config, v6e_2x2):
    return compiled.compile_train_step(TINY, model_config, v6e_2x2)


def test_the_tiny_step_compiles_for_v6e_with_its_figures(tiny_step, model_config, v6e_2x2):
    assert tiny_step.device_kind == "TPU v6 lite" and tiny_step.chips == 4
    # The state (float32 masters + AdamW's two moments, replicated: no FSDP) is an argument, donated.
    state_bytes = 12 * flops.param_count(model_config)
    assert state_bytes <= tiny_step.arguments < state_bytes + 2**20
    assert tiny_step.aliased >= state_bytes * 0.99
    # What the step's search checks before compiling (hbm.arguments_refusal) is the compiler's own figure
    # less the padding of small arrays to the TPU's tiles (10 KiB here): a refusal on it is always right.
    run_step, _ = compiled.lower_train_step(TINY, model_config, v6e_2x2, num_slices=1)
    before_compiling = hbm.argument_bytes_per_chip(step.abstract_train_args(run_step, TINY, model_config))
    assert before_compiling <= tiny_step.arguments < before_compiling * 1.01
    assert 0 < tiny_step.bytes_per_chip < hbm.usable_hbm_bytes(v6e_2x2)
    # The compiler's FLOPs against 6N + attention: the dense [L, L] attention also computes the masked
    # (future) half, and softmax, norms and the optimizer add element-wise work; measured 1.27x.
    analytic = flops.training_flops_per_token(model_config, TINY.seq_len) * TINY.batch_size * TINY.seq_len / 4
    assert tiny_step.flops_loop_correction == 0  # 512 x 512 logits: no vocabulary loop
    assert 1.0 <= tiny_step.flops_per_chip / analytic <= 1.6
    assert tiny_step.bytes_accessed > tiny_step.arguments


def test_remat_auto_takes_the_fastest_by_the_compilers_figures(model_config, v6e_2x2):
    """--remat auto on TPU chips compares the policies that fit by their compiled bound and runs the fastest;
    the tiny model's step is bound by its HBM bytes, so every policy is compiled and compared."""
    auto = compiled.compile_train_step(dataclasses.replace(TINY, batch_size=4, seq_len=128, remat="auto"), model_config, v6e_2x2)
    speeds = {speed.remat: speed for speed in auto.remat_speeds}
    assert set(speeds) == {"none", "dots", "full"} and auto.remat_speeds[0].remat == auto.remat
    assert auto.bound() == (speeds[auto.remat].seconds, speeds[auto.remat].bound_by)
    assert speeds[auto.remat].seconds == min(speed.seconds for speed in speeds.values())


def test_the_bytes_are_named_by_the_operations_they_come_from(tiny_step):
    """Split by source, the step's HBM traffic names the loss head and the optimizer, and leaves out what never
    leaves the chip: the tiny model's layers run wholly on operands XLA placed in on-chip memory (S(1)), so they
    move no HBM bytes themselves; the prefetches that bring their weights there carry no source. The split is
    then far below the compiler's own count, which charges on-chip operands as HBM traffic (measured 0.08)."""
    sources = tiny_step.bytes_by_source
    for part in ("forward loss head", "optimizer", "no source (XLA's own copies and collectives)"):
        assert sources[part] > 0, (part, sorted(sources.items()))
    assert sum(sources.values()) < 0.2 * tiny_step.bytes_reported


def test_on_tpu_no_tensor_is_l_by_l(tiny_step, model_config, v6e_2x2):
    """Packed attention runs through the splash kernel: the optimized program holds no [.., L, L]
    tensor. The dense path, still there for CPU, does (so the check can tell)."""
    assert tiny_step.attention == "splash" and tiny_step.flops_kernels > 0
    assert tiny_step.l_by_l_tensor is False
    dense = compiled.compile_train_step(dataclasses.replace(TINY, attention="dense"), model_config, v6e_2x2)
    assert dense.attention == "dense" and dense.l_by_l_tensor is True and dense.flops_kernels == 0


def test_where_the_head_width_is_the_row_length_no_one_can_tell(model_config, v6e_2x2):
    """Gemma 3's heads are 256 wide: at seq 256 its projections' [.., 256, 256] squares look like [L, L]
    (the multihost stack's gemma3-270m at 128 x 256 said true with splash attention): the answer is None."""
    rows_as_wide_as_heads = dataclasses.replace(TINY, seq_len=model_config.head_dim)
    assert compiled.compile_train_step(rows_as_wide_as_heads, model_config, v6e_2x2).l_by_l_tensor is None


def test_the_loss_heads_loop_is_counted_once_per_iteration(tiny_step, model_config, v6e_2x2):
    """Chunked into 4 (token chunks against the whole vocabulary), the compiler sees one iteration of the
    loop; with the missing three added, the step costs what the plain-logits step does: the same three
    matmuls of [tokens, vocab] x [vocab, embed], nothing recomputed."""
    chunked = compiled.compile_train_step(dataclasses.replace(TINY, vocab_chunk=str(VOCAB // 4)), model_config, v6e_2x2)
    tokens_per_chip = TINY.batch_size * TINY.seq_len / 4
    # The compiler's count of the missing three iterations: 6 FLOPs a multiply-add (logits, 2 gradients).
    assert chunked.flops_loop_correction == pytest.approx(3 * 6 * tokens_per_chip / 4 * VOCAB * model_config.embed_dim, rel=0.1)
    assert chunked.bytes_loop_correction > 0
    assert chunked.flops_per_chip == pytest.approx(tiny_step.flops_per_chip, rel=0.05)


def test_splits_compile_every_fsdp_group_and_name_the_fastest_that_fits(model_config, v6e_2x2):
    """`fit --splits`: the step compiled for FSDP over 4, 2 and 1 chips of the slice (data parallel over the
    rest); a smaller group holds more of the state per chip, and the collectives' ICI bytes are counted."""
    config = dataclasses.replace(TINY, mesh={"data": -1, "fsdp": 4})
    report = compiled.fit(config, v6e_2x2, vocab_size=VOCAB, search_batch=False, compare_splits=True, compare_precision=False).report()
    rows = report["splits"]
    assert [row["mesh"]["fsdp"] for row in rows] == [4, 2, 1]
    assert all(row["fits"] and row["ici_bytes_per_chip"] > 0 for row in rows)
    assert rows[0]["compiled_bytes_per_chip"] < rows[2]["compiled_bytes_per_chip"]  # fsdp=4 splits the state 4 ways
    assert report["best_mesh"] == min(rows, key=lambda row: row["step_time_bound_s"])["mesh"]


def test_a_batch_far_too_large_does_not_fit_and_says_by_how_much(v6e_2x2):
    """The compiler itself refuses the program (temporaries over the HBM it allows): rows of 65,536
    tokens with the dense mask, whose [L, L] logits alone are 16 GiB a row and head."""
    huge = dataclasses.replace(TINY, seq_len=65_536, attention="dense", remat="full")  # one policy: one compile
    report = compiled.fit(huge, v6e_2x2, vocab_size=VOCAB, search_batch=False).report()
    assert report["fits"] is False and report["headroom_gib"] < 0 and report["refused_for"] == "HLO temporaries"
    assert report["compiled_bytes_per_chip"] > report["usable_hbm_bytes_per_chip"] == hbm.usable_hbm_bytes(v6e_2x2)
    assert 31 * GIB < report["usable_hbm_bytes_per_chip"] < 32 * GIB  # v6e: 32 GiB, of which the compiler lets 31.24 be used


def test_a_state_too_large_for_its_chips_is_refused_without_compiling(monkeypatch):
    """gemma3-12b full fine-tune on one v6e chip: its float32 weights and AdamW moments alone are over
    100 GiB, which no rematerialisation or loss head changes, so the answer comes before any compile."""
    one_chip = compiled.tpu_devices("v6e", "1x1")
    hbm.usable_hbm_bytes(one_chip)  # asked of the compiler once, by a probe program
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda *_: pytest.fail("compiled a step whose state cannot fit"))
    config = TrainConfig(model="gemma3-12b", weights="random", batch_size=8, seq_len=256, mesh={"data": 1, "fsdp": 1})
    report = compiled.fit(config, one_chip, search_batch=False).report()
    state = 12 * flops.param_count(models.model_config("gemma3-12b", vocab_size=0))
    assert report["fits"] is False and report["refused_for"] == hbm.ARGUMENTS
    assert state <= report["compiled_bytes_per_chip"] < state * 1.01
    assert report["headroom_gib"] < -60


def test_multislice_compiles_for_every_slice(model_config):
    devices = compiled.tpu_devices("v6e", "2x2", num_slices=2)
    assert len(devices) == 8 and {device.slice_index for device in devices} == {0, 1}
    two_slices = compiled.compile_train_step(dataclasses.replace(TINY, mesh={"data": -1, "fsdp": 4}), model_config, devices,
                                             num_slices=2)
    assert two_slices.chips == 8
    # FSDP over each slice's 4 chips: each chip holds about a quarter of the state.
    assert two_slices.arguments < 12 * flops.param_count(model_config) / 2


@pytest.mark.parametrize("accelerator, topology, message", [
    ("v6e", "3x3", "topology v6e 3x3 x 1 slice(s): the TPU compiler refuses it"),
    ("v4", "2x2x1", "accelerator 'v4': the TPU compiler knows v5e, v5p, v6e"),
])
def test_a_topology_the_compiler_does_not_know_is_one_line(accelerator, topology, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as error:
        compiled.tpu_devices(accelerator, topology)
    assert "\n" not in str(error.value)


def test_a_batch_the_chips_do_not_divide_is_one_line(model_config, v6e_2x2):
    with pytest.raises(UserError, match="^--batch-size 6 must be a multiple of the 4 devices$"):
        compiled.compile_train_step(dataclasses.replace(TINY, batch_size=6), model_config, v6e_2x2)


def test_a_mesh_the_chips_do_not_divide_is_one_line(model_config, v6e_2x2):
    with pytest.raises(UserError, match=r"^--mesh data=3,fsdp=1: needs 3 devices, this job has 4$"):
        compiled.compile_train_step(dataclasses.replace(TINY, mesh={"data": 3, "fsdp": 1}), model_config, v6e_2x2)


class _Compiled:
    """A compiled program's memory_analysis(), as the compiler reports it for gemma3-1b full fine-tune at
    8192 x 16 rows on v6e 2x4 with no rematerialisation (bench.tpu_fit): temporaries just inside the
    usable HBM, the donated state beside them."""

    def __init__(self, temporaries_gib: float = 31.21):
        self.memory = types.SimpleNamespace(
            argument_size_in_bytes=int(1.4 * GIB), output_size_in_bytes=int(1.4 * GIB), alias_size_in_bytes=int(1.4 * GIB),
            temp_size_in_bytes=int(temporaries_gib * GIB), generated_code_size_in_bytes=int(0.07 * GIB))

    def memory_analysis(self):
        return self.memory


def test_a_program_fits_when_the_whole_of_it_does(v6e_2x2):
    """libtpu compiled the program above (its check reads the temporaries), yet with the state it needs
    32.68 GiB of the 31.24 a chip allows: the step's search goes on to the next candidate."""
    refusal = hbm.whole_program_refusal(_Compiled(), v6e_2x2)
    assert refusal.required == hbm.needed_bytes(_Compiled()) > refusal.available == hbm.usable_hbm_bytes(v6e_2x2)
    assert str(refusal).startswith("the train step does not fit: its arguments, outputs and temporaries need 32.68 GiB per "
                                   "chip, the TPU compiler allows 31.24 GiB; lower --batch-size")
    assert hbm.whole_program_refusal(_Compiled(temporaries_gib=28), v6e_2x2) is None


def _step_of(batch: int, remat: str, needed: int) -> compiled.CompiledStep:
    """A compiled step of which the batch search reads its memory and policies (its costs: 1 TFLOP, else 0)."""
    figures = {field.name: 0 for field in dataclasses.fields(compiled.CompiledStep)}
    return compiled.CompiledStep(**{**figures, "device_kind": "TPU v6 lite", "chips": 8, "flops_reported": 1e12, "remat_speeds": (),
                                    "batch_size": batch, "attention": "splash",
                                    "remat": remat, "vocab_chunk": None, "bytes_per_chip": needed, "bytes_by_source": {},
                                    "fingerprint": None, "l_by_l_tensor": False})


class _RematLines:
    """The step's memory per chip as a line in the batch for each rematerialisation policy, shaped as
    the issue's run (gemma3-4b LoRA r16 at 4096 tokens a row on v6e 2x4: 30 GiB at batch 16 with remat
    none); compiled as --remat auto compiles it, the first policy that fits. Records each compile."""

    BASE, PER_ROW, USABLE = 6 * GIB, {"none": 1.5 * GIB, "dots": 1.0 * GIB, "full": 0.4 * GIB}, int(31.24 * GIB)

    def __init__(self):
        self.compiles = []

    def __call__(self, config, model_config, devices, *, num_slices=1, images_per_row=0):
        for remat in step.remat_candidates(config.remat):
            needed = int(self.BASE + self.PER_ROW[remat] * config.batch_size // config.grad_accum_steps)
            self.compiles.append((config.batch_size, remat))
            if needed <= self.USABLE:
                return _step_of(config.batch_size, remat, needed)
        raise hbm.MemoryRefusal("arguments, outputs and temporaries", needed, self.USABLE)


@pytest.mark.parametrize("batch, remat, largest, searched, accumulated", [
    # Fits with remat none; at twice the batch auto would take full, whose point is below the first: the old
    # line through both fell with the batch and answered 0.
    (16, "none", 16, [(32, "none")], []),
    # Does not fit with any policy; a quarter of the batch fits with none, whose line is not full's: the old
    # search stopped at 48 where full fits 56. Then 2 micro-batches of 32 (accumulation_that_fits), with full.
    (64, "full", 56, [(16, "full"), (56, "full")], [(64, "none"), (64, "dots"), (64, "full")]),
])
def test_the_batch_search_holds_one_remat_policy(monkeypatch, v6e_2x2, batch, remat, largest, searched, accumulated):
    """Memory is one line in the batch only for one policy: every compile of the search uses the policy the
    run's step was found with (the last of --remat's candidates when none fits), and reports it."""
    lines = _RematLines()
    monkeypatch.setattr(compiled, "compile_train_step", lines)
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: lines.USABLE)
    config = TrainConfig(model="gemma3-4b", weights="random", batch_size=batch, seq_len=4096, lora_rank=16, steps=10)
    devices = v6e_2x2 * 2  # a v6e 2x4 slice as the search counts it: 8 chips
    report = compiled.fit(config, devices).report()
    assert report["largest_batch"] == largest and report.get("largest_batch_remat") == remat
    first = lines.compiles[:lines.compiles.index(searched[0])]
    assert {compile[0] for compile in first} == {batch} and lines.compiles == first + searched + accumulated
    assert report.get("grad_accum_steps_that_fit") == (2 if accumulated else None)


def test_the_largest_batch_is_at_least_the_runs_own_on_the_tiny_model(monkeypatch, model_config, v6e_2x2):
    """The tiny model at 8 x 512 on v6e 2x2, with a chip of 60 MB: the run's step fits with remat none (48 MB),
    twice its batch only with remat full (56 MB; none needs 91 MB). Searched with remat none throughout, the
    largest batch is the run's own, not a line through none's and full's points (which mixes two policies)."""
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: 60_000_000)
    config = dataclasses.replace(TINY, seq_len=512)
    report = compiled.fit(config, v6e_2x2, vocab_size=VOCAB, compare_precision=False).report()
    assert report["fits"] and report["remat"] == "none"
    assert report["largest_batch"] == 8 and report.get("largest_batch_remat") == "none"


def test_a_full_fine_tune_whose_float32_state_does_not_fit_is_compiled_again_lean(monkeypatch, v6e_2x2):
    """fit answers for the lean precision where only it fits (8 bytes a parameter instead of 16), for
    lean-factored where only that fits (6), compiles neither where the bytes it would save are fewer than the
    step is over, and compiles no lean step for a run that fits, a LoRA run, or one already lean."""
    compiles = []
    usable = {"bytes": 12 * GIB}

    def state_bytes_compile(config, model_config, devices, *, num_slices=1, images_per_row=0):
        compiles.append(config.precision)
        needed = int({"lean": 8, "lean-factored": 6}.get(config.precision, 16) * GIB)
        if needed > usable["bytes"]:
            raise hbm.MemoryRefusal("arguments, outputs and temporaries", needed, usable["bytes"])
        return _step_of(config.batch_size, "full", needed)

    monkeypatch.setattr(compiled, "compile_train_step", state_bytes_compile)
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: usable["bytes"])
    config = TrainConfig(model="gemma3-1b", weights="random", batch_size=8, seq_len=1024, steps=10)
    report = compiled.fit(config, v6e_2x2, search_batch=False).report()
    assert (report["fits"], report["lean_precision"], report["lean_fits"], report["lean_compiled_bytes_per_chip"]) == (
        False, "lean", True, 8 * GIB)
    assert compiles == ["float32", "lean"]
    # gemma3-1b's 1.0e9 parameters: lean saves at most 7.5 GiB of the 9 over, lean-factored 9.3: only it is compiled.
    usable["bytes"], compiles[:] = 7 * GIB, []
    report = compiled.fit(config, v6e_2x2, search_batch=False).report()
    assert (report["lean_precision"], report["lean_fits"], report["lean_compiled_bytes_per_chip"]) == ("lean-factored", True, 6 * GIB)
    assert compiles == ["float32", "lean-factored"]
    usable["bytes"], compiles[:] = 5 * GIB, []
    assert "lean_fits" not in compiled.fit(config, v6e_2x2, search_batch=False).report() and compiles == ["float32"]
    usable["bytes"] = 12 * GIB
    for other in (dataclasses.replace(config, precision="lean"), dataclasses.replace(config, lora_rank=16)):
        compiles.clear()
        assert "lean_fits" not in compiled.fit(other, v6e_2x2, search_batch=False).report() and len(compiles) == 1


def test_a_float32_run_that_fits_is_compared_with_lean_factored(monkeypatch, v6e_2x2):
    """A float32 full fine-tune that fits is compiled again with lean-factored: the report has the speed-up of
    the compiler's bound (FLOPs here: 1.4 against 1.0 TFLOP); nothing is compiled for a run already lean or LoRA."""
    compiles, usable = [], {"bytes": 20 * GIB}

    def precision_compile(config, model_config, devices, *, num_slices=1, images_per_row=0):
        compiles.append(config.precision)
        needed = {"float32": 16, "lean-factored": 6}.get(config.precision, 8) * GIB
        if needed > usable["bytes"]:
            raise hbm.MemoryRefusal("arguments, outputs and temporaries", needed, usable["bytes"])
        flops = {"float32": 1.4e12, "lean-factored": 1.0e12}.get(config.precision, 1.2e12)
        return dataclasses.replace(_step_of(config.batch_size, "dots", needed), flops_reported=flops)

    monkeypatch.setattr(compiled, "compile_train_step", precision_compile)
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: usable["bytes"])
    config = TrainConfig(model="gemma3-1b", weights="random", batch_size=8, seq_len=1024, steps=10)
    report = compiled.fit(config, v6e_2x2, search_batch=False).report()
    assert compiles == ["float32", "lean-factored"] and report["fits"]
    assert (report["faster_precision"], report["faster_remat"], report["faster_compiled_bytes_per_chip"]) == (
        "lean-factored", "dots", 6 * GIB)
    assert report["faster_speedup"] == pytest.approx(1.4)
    for other in (dataclasses.replace(config, precision="lean"), dataclasses.replace(config, lora_rank=16)):
        compiles.clear()
        assert "faster_speedup" not in compiled.fit(other, v6e_2x2, search_batch=False).report() and len(compiles) == 1


def test_a_refused_trainer_run_is_told_the_settings_that_fit_with_their_figures(monkeypatch, v6e_2x2):
    """The trainer's refused step (float32 gemma3-1b, batch 8 on 4 chips of 12 GiB: 14 GiB) gets fit's search as
    flags: lean (9 GiB), 2 micro-batches (12 GiB), batch 4; the refusal it already has is not compiled again."""
    compiles = []

    def state_and_rows(config, model_config, devices, *, num_slices=1, images_per_row=0):
        compiles.append((config.precision, config.batch_size, config.grad_accum_steps))
        state = {"float32": 10, "lean": 5, "lean-factored": 4}[config.precision]
        needed = int((state + 0.5 * config.batch_size // config.grad_accum_steps) * GIB)
        if needed > 12 * GIB:
            raise hbm.MemoryRefusal("arguments, outputs and temporaries", needed, 12 * GIB)
        return _step_of(config.batch_size, "full", needed)

    monkeypatch.setattr(compiled, "compile_train_step", state_and_rows)
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: 12 * GIB)
    config = TrainConfig(model="gemma3-1b", weights="random", batch_size=8, seq_len=1024, steps=10)
    refused = hbm.MemoryRefusal("arguments, outputs and temporaries", 14 * GIB, 12 * GIB)
    line = compiled.settings_that_fit(config, models.model_config("gemma3-1b", vocab_size=0), v6e_2x2, refused)
    assert line == ("the compiler fits --precision lean (bfloat16 weights and AdamW state: 9.0 GiB per chip, which fits; "
                    "docs/fit.md has its quality figures), or --grad-accum-steps 2 (the same batch as 2 micro-batches of 4 rows, "
                    "one after another: 12.0 GiB per chip, which fits), or --batch-size 4 or less (it fits with remat full)")
    assert ("float32", 8, 1) not in compiles


def test_with_accumulation_the_step_costs_the_whole_batch_and_holds_a_micro_batch(tiny_step, model_config, v6e_2x2):
    """--grad-accum-steps 2: the compiler counts one micro-batch of the loop; with the other added (the step less
    the optimizer's update, compiled alone) the step costs the one pass's FLOPs, and a chip holds the activations
    of 4 rows, not 8 (measured 32.8 MB against 35.4; batch 4 at once: 32.4)."""
    accumulated = compiled.compile_train_step(dataclasses.replace(TINY, grad_accum_steps=2), model_config, v6e_2x2)
    assert accumulated.grad_accum_steps == 2 and accumulated.flops_accumulation > 0.45 * accumulated.flops_per_chip
    assert accumulated.flops_per_chip == pytest.approx(tiny_step.flops_per_chip, rel=0.02)
    assert accumulated.bytes_per_chip < tiny_step.bytes_per_chip


class _MicroBatchLines(_RematLines):
    """_RematLines in the micro-batch's rows, plus the gradient sums (1 GiB) a step with accumulation keeps."""

    def __call__(self, config, model_config, devices, *, num_slices=1, images_per_row=0):
        rows = config.batch_size // config.grad_accum_steps
        needed = int(self.BASE + self.PER_ROW["full"] * rows + (GIB if config.grad_accum_steps > 1 else 0))
        self.compiles.append((config.batch_size, config.grad_accum_steps))
        if needed > self.USABLE:
            raise hbm.MemoryRefusal("arguments, outputs and temporaries", needed, self.USABLE)
        return _step_of(config.batch_size, "full", needed)


@pytest.mark.parametrize("accumulation, largest, searched, fitting", [
    # 128 rows at once need 57.2 GiB; 56 fit (28.4 GiB), so 128 as 4 micro-batches of 32 does (19.8 with the sums).
    (1, 56, [(32, 1), (56, 1)], 4),
    # Already 2 micro-batches of 64: the search is the micro-batch's (global batches in steps of 2 x 8 rows): 2 x 56 fit.
    (2, 112, [(32, 2), (112, 2)], 4),
])
def test_the_batch_search_is_the_micro_batchs_and_names_the_accumulation_that_fits(monkeypatch, v6e_2x2, accumulation,
                                                                                 largest, searched, fitting):
    lines = _MicroBatchLines()
    monkeypatch.setattr(compiled, "compile_train_step", lines)
    monkeypatch.setattr(hbm, "usable_hbm_bytes", lambda devices: lines.USABLE)
    config = TrainConfig(model="gemma3-4b", weights="random", batch_size=128, seq_len=4096, lora_rank=16, steps=10,
                         remat="full", grad_accum_steps=accumulation)
    report = compiled.fit(config, v6e_2x2 * 2).report()
    assert not report["fits"] and report["largest_batch"] == largest
    assert (report["grad_accum_steps"], report["micro_batch_size"]) == (accumulation, 128 // accumulation)
    assert report["grad_accum_steps_that_fit"] == fitting and lines.compiles == [(128, accumulation), *searched, (128, fitting)]


def test_fit_compiles_a_vision_language_run_with_its_images_and_says_their_share(tiny_step, model_config, v6e_2x2):
    """`fit` of a run whose rows hold images compiles the image encoder in (the batch carries the pixels) and
    reports what the images take of a row and of the step's arithmetic, counted in its model FLOPs."""
    vision = compiled.fit(TINY, v6e_2x2, vocab_size=VOCAB, search_batch=False, compare_precision=False, images_per_row=2).report()
    encoder = models.model_config("tiny", vocab_size=VOCAB, images=True).vision
    assert vision["images_per_row"] == 2 and vision["image_tokens_share"] == 2 * encoder.soft_tokens / TINY.seq_len
    text_flops = flops.training_flops_per_token(model_config, TINY.seq_len) * TINY.batch_size * TINY.seq_len / 4
    image_flops = 2 * flops.image_flops(encoder, model_config.embed_dim, train_encoder=False) * TINY.batch_size / 4
    assert vision["model_flops_per_chip_per_step"] == pytest.approx(text_flops + image_flops)
    assert vision["image_flops_share"] == pytest.approx(image_flops / (text_flops + image_flops))
    assert vision["compiled_parts"]["arguments"] > tiny_step.arguments  # the pixels
    assert vision["flops_reported_by_compiler"] > tiny_step.flops_reported  # the encoder runs
