"""The README's memory table is the TPU compiler's (docs/memory-table.json, made by
`python -m trainer.measure.memory_table`): the README shows the JSON, the formula column is today's
formula, and the JSON was compiled from today's train step (an entry's fingerprint, re-lowered here;
lowering is seconds, the compile the JSON holds is minutes); rows of an older step are marked."""

import pathlib

import jax
import pytest

from trainer.model import models
from trainer.run import step
from trainer.config import parse_config
from trainer.measure import compiled, memory_table

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
REGENERATE = "the train step changed since docs/memory-table.json was made: run python -m trainer.measure.memory_table"


@pytest.fixture(scope="module")
def entries():
    return memory_table.read_entries()


def test_the_readme_shows_the_compiled_table(entries):
    assert memory_table.markdown(entries) in README.read_text(), \
        "paste the table of `python -m trainer.measure.memory_table --print` into README.md"


def test_the_formula_column_is_todays_formula(entries):
    for entry in entries:
        assert entry["formula_gib"] == memory_table.formula_gib(entry["model"], entry["lora_rank"], entry["topology"],
                                                                entry["slices"]), entry


def test_each_shipped_shape_and_both_modes_are_compiled(entries):
    compiled_shapes = {(e["topology"], e["slices"]) for e in entries}
    assert compiled_shapes == set(memory_table.SHAPES)
    assert {e["lora_rank"] for e in entries} == {0, memory_table.LORA_RANK}
    assert all(e["fits"] == (e["compiled_gib"] <= e["usable_gib"]) for e in entries)


def _lowered_fingerprint(entry: dict) -> str:
    """The fingerprint of `entry`'s step lowered today, with the policy and chunk --remat and
    --vocab-chunk auto settled on in its compile (seconds; the compile is minutes)."""
    args = memory_table.entry_args(entry["model"], entry["lora_rank"], entry["topology"], entry["slices"])
    config = parse_config([*args, "--remat", entry["remat"], "--vocab-chunk", str(entry["vocab_chunk"] or "none")])
    devices = compiled.tpu_devices("v6e", entry["topology"], num_slices=entry["slices"])
    model_config = models.model_config(entry["model"], vocab_size=0)
    _, lowered = compiled.lower_train_step(config, model_config, devices, num_slices=entry["slices"])
    assert jax.devices()[0].platform == "cpu"  # lowered for TPU on this host's CPU
    return step.step_fingerprint(lowered)


# The reference entry names the table's step; a full fine-tune on a multi-chip slice is checked too when
# it claims today's step.
@pytest.mark.parametrize("key", [memory_table.REFERENCE, ("gemma3-270m", 0, "2x4", 1)], ids=["reference", "full-2x4"])
def test_the_rows_that_claim_todays_step_were_compiled_from_it(entries, key):
    pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")
    entry = next(e for e in entries if memory_table.entry_key(e) == key)
    if not memory_table.is_current(entry, entries):
        assert f"{entry['compiled_gib']:.2f} {memory_table.OLDER_STEP_MARK} |" in memory_table.markdown(entries)
        pytest.skip(f"{key} is marked as compiled from an older step")
    assert _lowered_fingerprint(entry) == entry["step_fingerprint"], REGENERATE


def test_a_row_of_an_older_step_is_marked_and_explained(entries):
    today = memory_table.current_step(entries)
    older = [dict(entry, step=today if entry["model"] == "gemma3-270m" else "an older step") for entry in entries]
    table = memory_table.markdown(older)
    marked = [row for row in table.splitlines() if f" {memory_table.OLDER_STEP_MARK} |" in row]
    assert len(marked) == sum(e["model"] != "gemma3-270m" for e in entries) and all("gemma3-270m" not in row for row in marked)
    assert table.splitlines()[-1].startswith(f"{memory_table.OLDER_STEP_MARK} compiled from an older train step")
    assert memory_table.OLDER_STEP_MARK not in memory_table.markdown([dict(e, step=memory_table.current_step(entries)) for e in entries])
