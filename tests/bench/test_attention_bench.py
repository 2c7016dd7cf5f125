"""`python -m bench.attention --dry-run`: the attention benchmark runs on the CPU (the flash kernel in
Pallas' interpreter) and its figures show the kernel's program holding less memory than the dense
mask's, which keeps [L, L] logits."""

import json

from bench import attention


def test_the_dry_run_compares_the_kernel_with_the_dense_mask(tmp_path, capsys):
    figures = tmp_path / "attention.json"
    assert attention.main(["--dry-run", "--json", str(figures)]) == 0
    (row,) = json.loads(figures.read_text())["rows"]  # the tiny model has local layers only
    assert row["kernel"] == "flash" and row["seq_len"] == attention.DRY_RUN_SEQ_LEN
    assert 0 < row["kernel_bytes"] < row["dense_bytes"] / 2
    assert "sliding_attention  dense" in capsys.readouterr().out
