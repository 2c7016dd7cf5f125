"""The README's memory table is the TPU compiler's (docs/memory-table.json, made by
`python -m trainer.measure.memory_table`): the README shows the JSON, the formula column is today's
formula, and the JSON was compiled from today's train step (an entry's fingerprint, re-lowered here;
lowering is seconds, the compile the JSON holds is minutes)."""

import pathlib

import jax
import pytest

from trainer import models, step
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


@pytest.mark.parametrize("lora_rank, topology", [(memory_table.LORA_RANK, "1x1"), (0, "2x4")])
def test_the_table_was_compiled_from_todays_step(entries, lora_rank, topology):
    """A LoRA row on one chip and a full fine-tune's on a multi-host slice (FSDP over 8 chips)."""
    pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")
    entry = next(e for e in entries if e["model"] == "gemma3-270m" and e["lora_rank"] == lora_rank and e["topology"] == topology
                 and e["slices"] == 1)
    args = memory_table.entry_args(entry["model"], entry["lora_rank"], entry["topology"], entry["slices"])
    # the policy and chunk --remat and --vocab-chunk auto settled on
    config = parse_config([*args, "--remat", entry["remat"], "--vocab-chunk", str(entry["vocab_chunk"] or "none")])
    devices = compiled.tpu_devices("v6e", entry["topology"], num_slices=entry["slices"])
    model_config = models.model_config(entry["model"], vocab_size=0)
    _, lowered = compiled.lower_train_step(config, model_config, devices, num_slices=entry["slices"])
    assert step.step_fingerprint(lowered) == entry["step_fingerprint"], REGENERATE
    assert jax.devices()[0].platform == "cpu"  # lowered for TPU on this host's CPU
