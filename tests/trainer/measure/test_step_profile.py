"""Where a traced step's time goes: each operation named by the step's HLO, its category, the table."""

import pytest

from trainer.errors import UserError
from trainer.measure import step_profile
from trainer.measure.step_profile import OpEvent

# A step's optimized HLO as the TPU compiler prints it, cut to one instruction of each kind.
HLO = """HloModule jit_train, entry_computation_layout={()->()}

%fused_computation.1 (param_0: bf16[8,8], param_1: bf16[8,8]) -> bf16[8,8] {
  %param_0 = bf16[8,8]{1,0} parameter(0)
  %param_1 = bf16[8,8]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[8,8]{1,0} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%fused_computation.2 (param_0.2: bf16[8,8]) -> bf16[8,8] {
  %param_0.2 = bf16[8,8]{1,0} parameter(0)
  ROOT %transpose.2 = bf16[8,8]{0,1} transpose(%param_0.2), dimensions={1,0}
}

%body (p: (s32[], bf16[8,8])) -> (s32[], bf16[8,8]) {
  %p = (s32[], bf16[8,8]{1,0}) parameter(0)
  %gte = bf16[8,8]{1,0} get-tuple-element(%p), index=1
  ROOT %multiply.9 = bf16[8,8]{1,0} multiply(%gte, %gte), metadata={op_name="jit(train)/jvp(loss_sums)/mul"}
}

ENTRY %main (a: bf16[8,8], b: bf16[8,8]) -> bf16[8,8] {
  %a = bf16[8,8]{1,0} parameter(0)
  %b = bf16[8,8]{1,0} parameter(1)
  %fusion.1 = bf16[8,8]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_computation.1, metadata={op_name="jit(train)/jvp(Transformer)/layer_0/mlp/dot_general"}
  %custom-call.3 = bf16[8,8]{1,0} custom-call(%a), custom_call_target="tpu_custom_call", metadata={op_name="jit(train)/jvp(Transformer)/layer_0/attn/splash"}
  %splash_mha_dq_segmented_no_residuals.8 = bf16[8,8]{1,0} custom-call(%a), custom_call_target="tpu_custom_call"
  %all-gather.4 = bf16[8,8]{1,0} all-gather(%a), dimensions={0}
  %add.5 = bf16[8,8]{1,0} add(%a, %b), metadata={op_name="jit(train)/add"}
  %fusion.2 = bf16[8,8]{0,1} fusion(%a), kind=kLoop, calls=%fused_computation.2
  %while.6 = (s32[], bf16[8,8]{1,0}) while(%a), condition=%cond, body=%body
  ROOT %tanh.7 = bf16[8,8]{1,0} tanh(%a), metadata={op_name="jit(train)/jvp(Transformer)/layer_0/mlp/tanh"}
}
"""


def test_each_instruction_is_placed_by_what_it_is_and_where_it_came_from():
    want = {"fusion.1": "matmuls", "custom-call.3": "attention kernel",
            "splash_mha_dq_segmented_no_residuals.8": "attention kernel", "all-gather.4": "collectives",
            "add.5": "optimizer update", "fusion.2": "copies and transposes", "multiply.9": "loss head",
            "tanh.7": "elementwise and reductions", "while.6": None}
    found = step_profile.categories(HLO)
    assert {name: found[name] for name in want} == want


def test_the_table_of_a_tpu_trace_leaves_out_control_flow_and_shows_the_device_idle():
    by_name = step_profile.categories(HLO)
    # A TPU trace names an operation by its HLO text; a loop's event spans its body's operations, traced too.
    tpu = lambda text, ns: OpEvent(step_profile._instruction_name(text), ns)  # noqa: E731
    events = [tpu("%fusion.1 = bf16[8,8]{1,0} fusion(bf16[8,8] %a, bf16[8,8] %b), kind=kOutput", 6e6),
              tpu("%while.6 = (s32[], bf16[8,8]) while(%a), condition=%cond, body=%body", 3e6),
              tpu("%multiply.9 = bf16[8,8]{1,0} multiply(%gte, %gte)", 3e6),
              tpu("%add.5 = bf16[8,8]{1,0} add(%a, %b)", 1e6),
              OpEvent("fusion.77", 5e6)]  # another program's operation
    rows = step_profile.step_table(events, by_name, steps=2, step_s=0.01, device_timeline=True)
    assert [(row.category, row.ms_per_step) for row in rows] == [
        ("matmuls", 3.0), ("loss head", 1.5), ("optimizer update", 0.5), (step_profile.HOST_GAPS, 5.0)]
    assert sum(row.share for row in rows) == pytest.approx(1.0)
    table = step_profile.format_table(rows, title="t")
    assert "matmuls" in table and "30.0%" in table and "host gaps (device idle)" in table


def test_without_a_device_timeline_shares_are_of_the_operations_time():
    rows = step_profile.step_table([OpEvent("fusion.1", 3e6), OpEvent("tanh.7", 1e6)], step_profile.categories(HLO),
                                   steps=1, step_s=1.0, device_timeline=False)
    assert [(row.category, row.share) for row in rows] == [("matmuls", 0.75), ("elementwise and reductions", 0.25)]


def test_a_folder_without_a_trace_is_one_line(tmp_path):
    with pytest.raises(UserError, match=f"^{tmp_path}: no profiler trace"):
        step_profile.profile_table(str(tmp_path), HLO, steps=1)
