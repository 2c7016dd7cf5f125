"""Where a traced step's time goes: each operation named by the step's HLO, its category, the table."""

import pytest

from trainer.errors import UserError
from trainer.measure import step_profile
from trainer.measure.step_profile import OpEvent

# A step's optimized HLO as the TPU compiler prints it, cut to one instruction of each kind.
HLO = """HloModule jit_train, entry_computation_layout={()->()}

FileNames
1 "/work/main/trainer/run/step.py"
2 "/work/main/trainer/run/optimizer.py"
3 "/venv/lib/python3.11/site-packages/optax/tree_utils/_tree_math.py"
4 "/venv/lib/python3.11/site-packages/optax/transforms/_combining.py"

FunctionNames
1 "make_step_functions.<locals>.train"
2 "forward_params.<locals>.<lambda>"
3 "adamw.<locals>.update"
4 "norm"
5 "chain.<locals>.update_fn"

FileLocations
1 {file_name_id=1 function_name_id=1 line=103 end_line=103 column=8 end_column=60}
2 {file_name_id=1 function_name_id=2 line=41 end_line=41 column=30 end_column=60}
3 {file_name_id=2 function_name_id=3 line=175 end_line=175 column=12 end_column=40}
4 {file_name_id=3 function_name_id=4 line=90 end_line=90 column=4 end_column=30}
5 {file_name_id=1 function_name_id=1 line=111 end_line=111 column=8 end_column=60}
6 {file_name_id=4 function_name_id=5 line=70 end_line=70 column=8 end_column=40}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
3 {file_location_id=3 parent_frame_id=1}
4 {file_location_id=5 parent_frame_id=4}
5 {file_location_id=4 parent_frame_id=4}
6 {file_location_id=6 parent_frame_id=0}


%fused_computation.1 (param_0: bf16[8,8], param_1: bf16[8,8]) -> bf16[8,8] {
  %param_0 = bf16[8,8]{1,0} parameter(0)
  %param_1 = bf16[8,8]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[8,8]{1,0} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%fused_computation.2 (param_0.2: bf16[8,8]) -> bf16[8,8] {
  %param_0.2 = bf16[8,8]{1,0} parameter(0)
  ROOT %transpose.2 = bf16[8,8]{0,1} transpose(%param_0.2), dimensions={1,0}
}

%fused_cast (param_0.3: f32[8,8]) -> bf16[8,8] {
  %param_0.3 = f32[8,8]{1,0} parameter(0)
  ROOT %convert.3 = bf16[8,8]{1,0} convert(%param_0.3)
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
  %convert.10 = bf16[8,8]{1,0} convert(%a), metadata={op_name="jit(train)/jvp(mean_loss)/convert_element_type" stack_frame_id=2}
  %convert.11 = f32[8,8]{1,0} convert(%a), metadata={op_name="jit(train)/transpose(jvp(mean_loss))/convert_element_type" stack_frame_id=2}
  %multiply.12 = bf16[8,8]{1,0} multiply(%a, %b), metadata={op_name="jit(train)/mul" stack_frame_id=3}
  %reduce.13 = f32[] reduce(%a, %b), dimensions={0,1}, to_apply=%add, metadata={op_name="jit(train)/reduce_sum" stack_frame_id=5}
  %fusion.14 = bf16[8,8]{1,0} fusion(%a), kind=kLoop, calls=%fused_cast, metadata={op_name="jit(train)/jvp(mean_loss)/convert_element_type"}
  %subtract.16 = bf16[8,8]{1,0} subtract(%a, %b), metadata={op_name="jit(train)/sub" stack_frame_id=6}
  %exponential.15 = bf16[8,8]{1,0} exponential(%a), metadata={op_name="jit(train)/jvp(mean_loss)/exp" stack_frame_id=1}
  %fusion.2 = bf16[8,8]{0,1} fusion(%a), kind=kLoop, calls=%fused_computation.2
  %while.6 = (s32[], bf16[8,8]{1,0}) while(%a), condition=%cond, body=%body
  ROOT %tanh.7 = bf16[8,8]{1,0} tanh(%a), metadata={op_name="jit(train)/jvp(Transformer)/layer_0/mlp/tanh"}
}
"""


def test_each_instruction_is_placed_by_what_it_is_and_where_it_came_from():
    want = {"fusion.1": "matmuls", "custom-call.3": "attention kernel",
            "splash_mha_dq_segmented_no_residuals.8": "attention kernel", "all-gather.4": "collectives",
            "add.5": "other", "fusion.2": "copies and transposes", "multiply.9": "loss head",
            "tanh.7": "elementwise and reductions", "while.6": None,
            # by the step's code they came from (the HLO's stack frames): the weights' cast and its gradient's,
            # the optimizer, the metrics (the gradients' norm, in optax, called by the step's train)
            "convert.10": "weight casts", "convert.11": "weight casts", "multiply.12": "optimizer update",
            "reduce.13": "metrics", "exponential.15": "loss head",
            # float32 AdamW is optax's chain, stored as the optimizer's update: its frames stop inside optax
            "subtract.16": "optimizer update",
            "fusion.14": "weight casts"}  # no stack frame: a conversion alone outside the model
    found = step_profile.categories(HLO)
    assert {name: found[name] for name in want} == want


def test_stack_frames_are_read_innermost_first():
    frames = step_profile.stack_frames(HLO)
    assert frames[5] == [("/venv/lib/python3.11/site-packages/optax/tree_utils/_tree_math.py", "norm"),
                         ("/work/main/trainer/run/step.py", "make_step_functions.<locals>.train")]
    assert step_profile.stack_frames(HLO.split("%fused_computation.1")[1]) == {}


def test_the_table_of_a_tpu_trace_leaves_out_control_flow_and_shows_the_device_idle():
    by_name = step_profile.categories(HLO)
    # A TPU trace names an operation by its HLO text; a loop's event spans its body's operations, traced too.
    tpu = lambda text, ns: OpEvent(step_profile._instruction_name(text), ns)  # noqa: E731
    events = [tpu("%fusion.1 = bf16[8,8]{1,0} fusion(bf16[8,8] %a, bf16[8,8] %b), kind=kOutput", 6e6),
              tpu("%while.6 = (s32[], bf16[8,8]) while(%a), condition=%cond, body=%body", 3e6),
              tpu("%multiply.9 = bf16[8,8]{1,0} multiply(%gte, %gte)", 3e6),
              tpu("%add.5 = bf16[8,8]{1,0} add(%a, %b)", 1e6),
              OpEvent("fusion.77", 5e6)]  # another program's operation: the device was busy, not idle
    rows = step_profile.step_table(events, by_name, steps=2, step_s=0.01, device_timeline=True)
    assert [(row.category, row.ms_per_step) for row in rows] == [
        ("matmuls", 3.0), (step_profile.NOT_IN_STEP, 2.5), ("loss head", 1.5), ("other", 0.5), (step_profile.HOST_GAPS, 2.5)]
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
