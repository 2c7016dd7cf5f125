"""MetricsReporter: metrics.jsonl, terminal output and TensorBoard events; read_metrics."""

import io
import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer import contract
from trainer.errors import UserError
from trainer.run.metrics import METRICS_FILE, MetricsReporter, read_metrics

TRAIN_METRICS = {
    "loss": 2.5,
    "learning_rate": 2e-5,
    "grad_norm": 0.75,
    "tokens_per_sec": 12_345.0,
    "tokens_per_sec_per_device": 3_086.25,
    "step_time_s": 0.25,
    "mfu": None,
}


class Terminal(io.StringIO):
    def isatty(self):
        return True


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_each_report_appends_one_json_object_with_its_keys(tmp_path):
    with MetricsReporter(tmp_path, total_steps=20, tensorboard_dir=None, stream=io.StringIO()) as reporter:
        reporter.report(10, TRAIN_METRICS)
        reporter.report(20, TRAIN_METRICS | {"loss": 2.0, "eval_loss": 2.1, "eval_perplexity": math.exp(2.1)})
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == read_metrics(tmp_path / METRICS_FILE)
    first, second = read_metrics(tmp_path / METRICS_FILE)
    assert first == {"step": 10} | TRAIN_METRICS
    assert (second["step"], second["loss"], second["eval_loss"]) == (20, 2.0, 2.1)


def test_numpy_and_jax_scalars_become_plain_numbers_and_non_finite_become_null(tmp_path):
    import jax.numpy as jnp

    with MetricsReporter(tmp_path, total_steps=5, tensorboard_dir=None, stream=io.StringIO()) as reporter:
        reporter.report(1, {"loss": jnp.float32(1.5), "tokens": np.int64(7), "grad_norm": float("nan"), "x": np.inf})
    (record,) = read_metrics(tmp_path / METRICS_FILE)
    assert record == {"step": 1, "loss": 1.5, "tokens": 7, "grad_norm": None, "x": None}
    assert "NaN" not in (tmp_path / METRICS_FILE).read_text()  # strict JSON readers (jq) must parse it


def test_a_resumed_run_appends_to_the_file(tmp_path):
    for step in (40, 41):
        with MetricsReporter(tmp_path, total_steps=80, tensorboard_dir=None, stream=io.StringIO()) as reporter:
            reporter.report(step, {"loss": 1.0})
    assert [record["step"] for record in read_metrics(tmp_path / METRICS_FILE)] == [40, 41]


def test_a_half_written_last_line_is_dropped_when_the_next_run_opens_the_file(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "lo')  # the run was killed mid-write
    with MetricsReporter(tmp_path, total_steps=3, tensorboard_dir=None, stream=io.StringIO()) as reporter:
        reporter.report(2, {"loss": 2.0})
    assert read_metrics(path) == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]


def test_not_a_terminal_prints_one_plain_line_per_report(tmp_path):
    stream = io.StringIO()
    with MetricsReporter(tmp_path, total_steps=20, tensorboard_dir=None, stream=stream) as reporter:
        reporter.report(10, TRAIN_METRICS)
        reporter.report(20, TRAIN_METRICS)
    output = stream.getvalue()
    assert "\r" not in output and "\x1b" not in output
    lines = output.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step 10/20 ")
    assert "loss 2.5000" in lines[0] and "mfu n/a" in lines[0] and "tok/s 12.3k" in lines[0] and "lr 2.00e-05" in lines[0]


def test_a_terminal_gets_one_redrawn_progress_bar_with_an_eta(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    stream, clock = Terminal(), FakeClock()
    with MetricsReporter(tmp_path, total_steps=100, tensorboard_dir=None, stream=stream, clock=clock) as reporter:
        reporter.report(10, TRAIN_METRICS)
        clock.now = 80.0  # 40 steps in 80 s: the 50 steps left take 100 s
        reporter.report(50, TRAIN_METRICS | {"mfu": 0.123})
    output = stream.getvalue()
    assert output.count("\r") == 2 and output.endswith("\n") and output.count("\n") == 1
    last = output.split("\r")[-1]
    assert "50%" in last and "step 50/100" in last and "mfu 12.3%" in last
    assert "ETA 0:01:40" in last


def test_the_progress_line_fits_a_narrow_terminal_and_keeps_the_eta(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    stream = Terminal()
    with MetricsReporter(tmp_path, total_steps=100, tensorboard_dir=None, stream=stream) as reporter:
        reporter.report(10, TRAIN_METRICS)
        reporter.report(20, TRAIN_METRICS)
    for line in stream.getvalue().split("\r")[1:]:
        visible = line.removesuffix("\n").removesuffix("\x1b[K")
        assert len(visible) < 72 and "ETA " in visible


def test_text_starts_below_the_progress_bar(tmp_path):
    stream = Terminal()
    with MetricsReporter(tmp_path, total_steps=10, tensorboard_dir=None, stream=stream) as reporter:
        reporter.report(5, {"loss": 1.0})
        reporter.text("samples/after", 10, "Once upon a time")
    bar, text = stream.getvalue().split("\n", 1)
    assert "step 5/10" in bar
    assert text.startswith("[samples/after, step 10]\nOnce upon a time")


def test_json_log_lines_are_one_object_each_the_record_and_its_plain_line(tmp_path):
    """--log-format json, even on a terminal (kubectl attach): GKE's logging agent makes each line a
    log entry's jsonPayload, which the stack's log-based metrics read."""
    stream = Terminal()
    with MetricsReporter(tmp_path, total_steps=20, tensorboard_dir=None, stream=stream, log_format="json") as reporter:
        reporter.report(10, TRAIN_METRICS | {"loss": float("nan")})
        reporter.report(20, TRAIN_METRICS)
        reporter.text("samples/after", 20, "Once upon\na time")
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    first, second, text = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert second == {"event": contract.REPORT_EVENT, "step": 20, **TRAIN_METRICS, "message": second["message"]}
    assert second["message"].startswith("step 20/20 loss 2.5000 ") and "tok/s 12.3k" in second["message"]
    assert first["loss"] is None  # strict JSON: a NaN would make the line unreadable to the agent
    assert text == {"event": contract.TEXT_EVENT, "tag": "samples/after", "step": 20, "message": "Once upon\na time"}
    assert read_metrics(tmp_path / METRICS_FILE)[1] == {"step": 20} | TRAIN_METRICS  # the same file either way


def test_tensorboard_events_hold_the_scalars_and_texts(tmp_path):
    tensorboard_dir = tmp_path / "tensorboard"
    with MetricsReporter(tmp_path, total_steps=20, tensorboard_dir=str(tensorboard_dir), stream=io.StringIO()) as reporter:
        reporter.report(10, TRAIN_METRICS)
        reporter.report(20, {"loss": 2.0, "eval_loss": 2.25})
        reporter.text("samples/before", 0, "a sample")
    events = EventAccumulator(str(tensorboard_dir), size_guidance={"tensors": 0})
    events.Reload()
    loss = [(event.step, event.value) for event in events.Scalars("loss")]
    assert loss == [(10, 2.5), (20, 2.0)]
    assert [(event.step, event.value) for event in events.Scalars("eval_loss")] == [(20, 2.25)]
    assert events.Scalars("learning_rate")[0].value == pytest.approx(2e-5)
    assert "mfu" not in events.Tags()["scalars"]  # None is no data point
    (text,) = events.Tensors("samples/before/text_summary")
    assert text.step == 0 and text.tensor_proto.string_val == [b"a sample"]


def test_a_resumed_run_hides_what_the_interrupted_run_logged_after_the_checkpoint(tmp_path):
    tensorboard_dir = str(tmp_path / "tensorboard")
    with MetricsReporter(tmp_path, total_steps=80, tensorboard_dir=tensorboard_dir, stream=io.StringIO()) as reporter:
        for step in (30, 40, 50):  # checkpoint at 40, then killed after reporting 50
            reporter.report(step, {"loss": 1.0})
    with MetricsReporter(
        tmp_path, total_steps=80, tensorboard_dir=tensorboard_dir, stream=io.StringIO(), start_step=41
    ) as reporter:
        reporter.report(50, {"loss": 0.5})
    events = EventAccumulator(tensorboard_dir)
    events.Reload()
    assert [(event.step, event.value) for event in events.Scalars("loss")] == [(30, 1.0), (40, 1.0), (50, 0.5)]


def test_other_processes_write_and_print_nothing(tmp_path):
    stream = io.StringIO()
    with MetricsReporter(
        tmp_path / "w", total_steps=5, tensorboard_dir=str(tmp_path / "tb"), is_main_process=False, stream=stream
    ) as reporter:
        reporter.report(1, {"loss": 1.0})
        reporter.text("samples", 1, "text")
    assert stream.getvalue() == "" and not (tmp_path / "w").exists() and not (tmp_path / "tb").exists()


def test_read_metrics_names_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="missing.jsonl does not exist"):
        read_metrics(tmp_path / "missing.jsonl")


def test_read_metrics_names_the_line_that_is_not_a_record(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1}\n\n[1, 2]\n')
    with pytest.raises(UserError, match=rf"{METRICS_FILE}:3 is not a metrics record"):
        read_metrics(path)


def test_an_unwritable_workdir_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot write metrics"):
        MetricsReporter(tmp_path / "file", total_steps=1, tensorboard_dir=None)
