"""The loss plot: a real PNG from metrics.jsonl, and the points it draws."""

import io
import sys

import matplotlib.image
import pytest

from trainer import contract
from trainer.__main__ import main as train_main
from trainer.errors import UserError
from trainer.run.metrics import METRICS_FILE, MetricsReporter, read_metrics
from trainer.measure.plot import main, plot_loss, series

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def metrics_path(tmp_path):
    with MetricsReporter(tmp_path, total_steps=30, tensorboard_dir=None, stream=io.StringIO()) as reporter:
        for step in range(1, 31):
            reporter.report(step, {"loss": 5.0 / step, "learning_rate": 1e-3})
            if step % 10 == 0:
                reporter.report(step, {"eval_loss": 6.0 / step})
    return tmp_path / METRICS_FILE


def test_plot_writes_a_valid_png(metrics_path, tmp_path):
    png = plot_loss(metrics_path, tmp_path / "plots" / "loss.png")
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    height, width, _channels = matplotlib.image.imread(png).shape
    assert width > 300 and height > 200


def test_train_and_eval_series_come_from_their_own_records(metrics_path):
    records = read_metrics(metrics_path)
    assert series(records, "loss") == (list(range(1, 31)), [5.0 / step for step in range(1, 31)])
    assert series(records, "eval_loss") == ([10, 20, 30], [0.6, 0.3, 0.2])


def test_a_step_reported_again_after_a_resume_keeps_the_later_value():
    records = [{"step": 40, "loss": 1.0}, {"step": 41, "loss": 0.9}, {"step": 41, "loss": 0.8}, {"step": 42, "loss": None}]
    assert series(records, "loss") == ([40, 41], [1.0, 0.8])


def test_no_loss_to_plot_is_a_user_error(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "loss": null}\n')
    with pytest.raises(UserError, match="no finite 'loss'"):
        plot_loss(path, tmp_path / "loss.png")


def test_cli_writes_loss_png_beside_the_metrics(metrics_path, capsys):
    assert main([str(metrics_path)]) == contract.OK
    assert (metrics_path.parent / "loss.png").read_bytes().startswith(PNG_SIGNATURE)


def test_cli_reports_a_missing_file_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nope.jsonl")]) == contract.USER_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "nope.jsonl does not exist" in error


@pytest.fixture
def no_matplotlib(monkeypatch):
    """As on a machine without matplotlib: importing the parts the plot draws with fails."""
    for name in ("matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_matplotlib_the_cli_is_one_line(metrics_path, no_matplotlib, capsys):
    assert main([str(metrics_path)]) == contract.USER_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "needs matplotlib, which is not installed" in error
    assert not (metrics_path.parent / "loss.png").exists()


def test_a_run_without_matplotlib_warns_and_succeeds(no_matplotlib, tmp_path, capsys, tokenizer_path, prepared_dir):
    """The plot comes after the export and the publication: its failure is a warning, not a failed run (exit 1 before)."""
    workdir = tmp_path / "run"
    assert train_main(["--model", "tiny", "--weights", "random", "--tokenizer", str(tokenizer_path), "--data", str(prepared_dir),
                       "--workdir", str(workdir), "--steps", "1", "--seq-len", "32", "--batch-size", "4", "--eval-fraction",
                       "0", "--no-samples"]) == contract.OK
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trainer: warning:")]
    assert warnings == [f"trainer: warning: the loss plot was not drawn: drawing {workdir / 'loss.png'} needs matplotlib, "
                        "which is not installed (import of matplotlib.backends.backend_agg halted; None in sys.modules); "
                        "pip install matplotlib"]
    assert (workdir / "export").is_dir() and not (workdir / "loss.png").exists()
