"""The per-chip memory estimate and the table `python -m trainer.measure.memory` prints."""

import dataclasses

import pytest
from trainer import contract
from trainer.model import models

from trainer.measure import flops, memory
from trainer.run import hardware

V6E_HBM = hardware.hbm_bytes(hardware.DEVICE_KIND_OF_ACCELERATOR["v6e"])
GEMMA3_1B = models.model_config("gemma3-1b", vocab_size=0)
GEMMA3_4B = models.model_config("gemma3-4b", vocab_size=0)
GLOBAL_BATCH, SEQ_LEN = 128, 256


def estimate(config, *, chips, lora_rank=0, fsdp=None, batch_per_chip=None):
    return memory.estimate_bytes_per_chip(
        config,
        chips=chips,
        fsdp=chips if fsdp is None else fsdp,
        lora_rank=lora_rank,
        batch_per_chip=GLOBAL_BATCH // chips if batch_per_chip is None else batch_per_chip,
        seq_len=SEQ_LEN,
    )


def test_total_is_the_sum_of_the_terms():
    terms = estimate(GEMMA3_1B, chips=8)
    total = terms.pop("total")
    assert total == pytest.approx(sum(terms.values()), abs=len(terms))


def test_full_fine_tune_state_is_16_bytes_per_parameter_plus_a_bf16_copy_on_one_chip():
    terms = estimate(GEMMA3_1B, chips=1, batch_per_chip=1)
    state = terms["weights"] + terms["gradients_and_optimizer"] + terms["compute_copy"]
    assert state == 18 * flops.param_count(GEMMA3_1B)


def test_fsdp_divides_the_sharded_state_but_not_the_activations():
    one, eight = estimate(GEMMA3_1B, chips=8, fsdp=1), estimate(GEMMA3_1B, chips=8, fsdp=8)
    assert eight["weights"] == pytest.approx(one["weights"] / 8, abs=1)
    assert eight["gradients_and_optimizer"] == pytest.approx(one["gradients_and_optimizer"] / 8, abs=1)
    assert eight["activations"] == one["activations"]


def test_lora_holds_the_frozen_base_in_bf16_and_optimizer_state_for_the_adapters_only():
    full, lora = estimate(GEMMA3_4B, chips=8), estimate(GEMMA3_4B, chips=8, lora_rank=16)
    assert lora["weights"] == pytest.approx(full["weights"] / 2, abs=1)
    assert lora["gradients_and_optimizer"] == 16 * flops.lora_param_count(GEMMA3_4B, 16)
    assert lora["gradients_and_optimizer"] < full["gradients_and_optimizer"] / 10


def test_activations_grow_with_the_batch():
    assert estimate(GEMMA3_1B, chips=1, batch_per_chip=32)["activations"] == 2 * estimate(
        GEMMA3_1B, chips=1, batch_per_chip=16
    )["activations"]


def test_1b_full_and_4b_lora_fit_one_v6e_2x4_slice_and_not_one_chip():
    # The sizing promise: Gemma 3 1B fully fine-tuned fits on one v6e 2x4, and 4B with LoRA does.
    assert estimate(GEMMA3_1B, chips=8)["total"] < V6E_HBM
    assert estimate(GEMMA3_4B, chips=8, lora_rank=16)["total"] < V6E_HBM
    assert estimate(GEMMA3_1B, chips=1)["total"] > V6E_HBM


def test_fsdp_beyond_the_chips_is_rejected():
    with pytest.raises(ValueError, match="fsdp"):
        estimate(GEMMA3_1B, chips=4, fsdp=8)


def test_the_table_has_a_row_per_model_shape_and_mode(capsys):
    assert memory.main(["--models", "gemma3-270m", "gemma3-1b", "--shapes", "v6e:1x1", "v6e:2x4"]) == contract.OK
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gemma3")]
    assert len(rows) == 2 * 2 * 2
    assert "| gemma3-1b | full | v6e 2x4 | 16 |" in "\n".join(rows)
    assert all(row.endswith(("| yes |", "| no |")) for row in rows)


def test_a_batch_that_does_not_divide_over_the_chips_is_one_line(capsys):
    assert memory.main(["--models", "gemma3-270m", "--shapes", "v6e:2x4", "--batch-size", "12"]) == contract.USER_ERROR
    assert capsys.readouterr().err.strip() == "error: --batch-size 12 does not divide over 8 chips"


def test_a_bad_shape_names_the_expected_form(capsys):
    with pytest.raises(SystemExit) as exit_info:
        memory.main(["--shapes", "v9:2x4"])
    assert exit_info.value.code == contract.USER_ERROR
    assert "ACCELERATOR:TOPOLOGY" in capsys.readouterr().err
