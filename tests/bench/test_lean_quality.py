"""`python -m bench.lean_quality --dry-run`: the lean precisions' quality method (a trained start, fine-tunes on
several seeds, the held-out loss against float32's) runs end to end on the CPU and writes its figures. The tiny
model's guard itself, at sizes that mean something, is tests/trainer/test_lean_precision.py's."""

import json

from bench import lean_quality


def test_the_dry_run_fine_tunes_from_a_trained_start_and_gives_a_verdict(tmp_path, capsys):
    out = tmp_path / "lean.json"
    assert lean_quality.main(["--dry-run", "--precision", "lean", "--workdir", str(tmp_path), "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    plan = lean_quality.DRY_RUN
    assert figures["model"] == "tiny" and figures["plan"]["steps"] == plan.steps
    assert set(figures["held_out_loss"]) == {"float32", "lean"}
    assert all(len(losses) == plan.seeds for losses in figures["held_out_loss"].values())
    assert figures["start_held_out_loss"] > max(figures["held_out_loss"]["float32"])  # the fine-tunes learned
    assert len(figures["gain_share"]["lean"]) == plan.seeds and figures["verdict"] in ("pass", "fail")
    assert "verdict: " in capsys.readouterr().out
