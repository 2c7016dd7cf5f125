"""gemma-tpu:serving: what a user sets, what vLLM would refuse, each caught as one line naming the key."""

import pytest

from infra.catalog import tpu
from infra.config import parse_stack_config
from infra.config.training import stack_models
from infra.config.serving import SERVED_MODELS, VLLM_LORA_RANKS
from infra.errors import ConfigError
from tests.infra.conftest import stack_values

IMAGE = "vllm/vllm-tpu:v0.27.0@sha256:" + "a" * 64


def serving_config(serving=None, *, stack="dev", training=None, **overrides):
    values = stack_values(stack, **overrides)
    values["gemma-tpu:serving"] = {"enabled": True, "image": IMAGE, **(serving or {})}
    if training:
        values["gemma-tpu:training"] = {**(values.get("gemma-tpu:training") or {}), **training}
    return parse_stack_config(values, stack)


def refused(serving=None, **kwargs) -> str:
    with pytest.raises(ConfigError) as error:
        serving_config(serving, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_serving_is_off_unless_enabled():
    assert parse_stack_config(stack_values("dev"), "dev").serving is None


def test_defaults_serve_the_stacks_run_on_one_chip():
    serving = serving_config().serving
    assert (serving.run, serving.slice.topology, serving.slice.chips) == ("gemma-finetune", "1x1", 1)
    assert (serving.replicas, serving.max_replicas, serving.autoscaled, serving.lora_rank) == (1, 1, False, None)
    assert serving.max_model_len == 8192


def test_the_newest_run_of_a_run_list_is_served_by_default():
    serving = serving_config(stack="queued").serving
    runs = parse_stack_config(stack_values("queued"), "queued").runs
    assert serving.run == runs[-1].name


def test_an_unknown_run_is_refused():
    message = refused({"run": "nope"})
    assert message.startswith("gemma-tpu:serving.run is 'nope', which is no run of this stack; choose one of gemma-finetune")


@pytest.mark.parametrize("image", ["vllm/vllm-tpu:latest", "vllm/vllm-tpu:v0.27.0", "vllm/vllm-tpu@sha256:abc", ""])
def test_an_image_without_a_digest_is_refused(image):
    assert refused({"image": image}).startswith(f"gemma-tpu:serving.image {image!r} is not pinned by digest")


@pytest.mark.parametrize("image", ["python:3.12-alpine", "python@sha256:abc"])
def test_a_smoke_image_without_a_digest_is_refused(image):
    assert refused({"smokeImage": image}).startswith(f"gemma-tpu:serving.smokeImage {image!r} is not pinned by digest")


def test_a_multi_host_slice_is_refused_with_the_single_host_ones():
    message = refused({"topology": "4x4"})
    assert message.startswith("gemma-tpu:serving.topology v6e 4x4 spans 4 hosts, and vLLM serves from one; choose one of 1x1, 2x2, 2x4")


def test_2x4_is_served_from_one_8_chip_host_not_the_training_pair():
    """GKE's vLLM on Trillium: one ct6e-standard-8t host of topology 2x4, tensor parallel over its 8 chips;
    the training catalog's 2x4 is two ct6e-standard-4t hosts."""
    serving = serving_config({"topology": "2x4"}, training={"model": "gemma3-4b"}).serving
    assert (serving.slice.machine_type, serving.slice.hosts, serving.slice.chips_per_host) == ("ct6e-standard-8t", 1, 8)
    assert tpu.slice_spec("v6e", "2x4").machine_type == "ct6e-standard-4t"


def test_a_topology_outside_the_catalog_names_the_key():
    assert refused({"topology": "3x3"}).startswith("gemma-tpu:serving.topology: topology '3x3' is not a v6e slice")


def test_a_slice_too_small_for_the_model_names_the_slices_that_hold_it():
    message = refused(training={"model": "gemma3-27b"})
    assert message.startswith("gemma-tpu:serving.topology v6e 1x1 cannot hold gemma3-27b:")
    assert "choose 2x2" in message and "lower gemma-tpu:serving.maxModelLen" in message


def test_the_same_model_fits_the_larger_slice():
    serving = serving_config({"topology": "2x2"}, training={"model": "gemma3-27b"}).serving
    assert serving.slice.chips == 4


def test_a_slice_whose_chips_do_not_divide_the_heads_is_refused():
    """vLLM refuses a tensor-parallel size that does not divide the attention heads: gemma3-1b has 4."""
    message = refused({"topology": "2x4"}, training={"model": "gemma3-1b"})
    assert message == ("gemma-tpu:serving.topology v6e 2x4: vLLM splits gemma3-1b's 4 attention heads over the slice's 8 chips, "
                       "which does not divide them; choose 1x1 or 2x2")
    assert all(model.heads % 4 == 0 for model in SERVED_MODELS.values())  # 1x1 and 2x2 serve every model


def test_the_served_model_table_is_the_trainers():
    """SERVED_MODELS restates, without importing gemma, what trainer.model.models and the export's config.json say."""
    from trainer.model import models
    from trainer.hf.config import model_config_json
    from trainer.measure import flops

    for name, served in SERVED_MODELS.items():
        config = models.model_config(name, vocab_size=0)
        exported = model_config_json(config, dtype="bfloat16", bos_id=2, eos_id=1, pad_id=0)
        assert served.params == flops.param_count(config), name
        assert (served.layers, served.heads, served.kv_heads, served.head_dim) == (
            exported["num_hidden_layers"], exported["num_attention_heads"], exported["num_key_value_heads"], exported["head_dim"],
        ), name  # fmt: skip
        assert served.max_len == exported["max_position_embeddings"], name
    assert set(SERVED_MODELS) == set(stack_models())


def test_a_max_length_above_the_models_is_refused():
    message = refused({"maxModelLen": 40000})
    assert message == (
        "gemma-tpu:serving.maxModelLen is 40000, above gemma3-270m's 32768 (max_position_embeddings of its export); set at most 32768"
    )


def test_a_long_context_that_does_not_fit_is_refused_though_the_weights_do():
    message = refused({"maxModelLen": 131072}, training={"model": "gemma3-12b"})
    assert "cannot hold gemma3-12b" in message and "131072-token sequence" in message


@pytest.mark.parametrize(("rank", "max_lora_rank"), [(4, 8), (8, 8), (16, 16), (300, 320), (512, 512)])
def test_an_adapter_is_served_with_the_smallest_rank_vllm_accepts(rank, max_lora_rank):
    serving = serving_config({"lora": "adapter"}, training={"loraRank": rank}).serving
    assert serving.lora_rank == max_lora_rank in VLLM_LORA_RANKS


def test_an_adapter_rank_above_vllms_is_refused():
    message = refused({"lora": "adapter"}, training={"loraRank": 1024})
    assert message.startswith("gemma-tpu:serving.lora is adapter, but run 'gemma-finetune' has loraRank 1024 and vLLM")
    assert serving_config({"lora": "merged"}, training={"loraRank": 1024}).serving.lora_rank is None


def test_an_adapter_of_a_full_fine_tune_is_refused():
    assert "is a full fine-tune (loraRank 0) and has no adapter" in refused({"lora": "adapter"})


def test_autoscaling_bounds():
    serving = serving_config({"replicas": 1, "autoscaling": {"maxReplicas": 3, "queueDepth": 5}}).serving
    assert (serving.replicas, serving.max_replicas, serving.queue_depth, serving.autoscaled) == (1, 3, 5, True)
    assert "needs both maxReplicas and queueDepth" in refused({"autoscaling": {"maxReplicas": 3}})
    assert "replicas is 0" in refused({"replicas": 0, "autoscaling": {"maxReplicas": 3, "queueDepth": 5}})
    assert "below gemma-tpu:serving.replicas 2" in refused({"replicas": 2, "autoscaling": {"maxReplicas": 1, "queueDepth": 5}})


def test_zero_replicas_is_allowed():
    assert serving_config({"replicas": 0}).serving.replicas == 0


def test_unknown_keys_are_refused_with_a_suggestion():
    assert refused({"replica": 2}).startswith("gemma-tpu:serving.replica is not a known key (did you mean replicas?)")
    assert refused({"autoscaling": {"max": 2}}).startswith("gemma-tpu:serving.autoscaling.max is not a known key")


def test_a_disabled_section_is_still_read_for_unknown_keys():
    values = stack_values("dev")
    values["gemma-tpu:serving"] = {"enabled": False, "topolgy": "2x2"}
    with pytest.raises(ConfigError, match="did you mean topology"):
        parse_stack_config(values, "dev")
