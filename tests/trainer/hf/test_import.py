"""Hugging Face directories in: our own export reads back bit for bit, and a Gemma 3 that transformers
made (text-only or multimodal, one file or shards), with a PEFT adapter that peft made, gives
transformers' logits in the JAX model. A directory that does not fit the run is refused from its config
and headers (the CLI's one-line cases: tests/trainer/bad_inputs.py).

transformers and peft run in .venv-hf (tests/hf_check.py, one subprocess); without it those tests skip.
"""

import dataclasses
import json
import pathlib
import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tests.trainer.hf.test_export import HF_PYTHON, REPO, TOLERANCE, jax_logits, max_diff, random_params, random_tokens, rich_config
from trainer.model import models
from trainer.config import parse_config
from trainer.errors import UserError
from trainer import export
from trainer.gemma3 import config as gemma3_config
from trainer.hf import config as hf_config, load as hf_load, weights as hf_weights

RANK = 4


def one_device(tree):
    return jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), tree)


def load_model(directory, config, name="tiny", vision=None):
    found = hf_load.ModelDirectory(str(directory))
    expected = jax.eval_shape(lambda: models.init_params(dataclasses.replace(config, vision=vision), seed=0))
    found.check(name, config, expected, vision=vision)
    return found.load(config, expected, one_device(expected), vision=vision)


def load_adapter(directory, config):
    found = hf_load.AdapterDirectory(str(directory))
    expected = jax.eval_shape(lambda: models.init_adapters(config, seed=0, lora_rank=RANK))
    found.check(config, expected, lora_rank=RANK)
    return found.load(config, expected, one_device(expected))


def random_adapters(config, seed=2):
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: models.init_adapters(config, seed=0, lora_rank=RANK))
    return jax.tree.map(lambda leaf: jnp.asarray(0.1 * rng.standard_normal(leaf.shape), leaf.dtype), shapes)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer):
    """A rich random model exported as bfloat16 in shards, and random adapters exported as float32."""
    root = tmp_path_factory.mktemp("import")
    config = rich_config(tokenizer.vocab_size)
    params, adapters = random_params(config), random_adapters(config)
    (root / "model").mkdir()
    export.write_model(root / "model", config, params, tokenizer, dtype="bfloat16", max_shard_bytes=200_000)
    (root / "adapter").mkdir()
    export.write_adapter(root / "adapter", config, adapters, rank=RANK, base_model="test", dtype="float32")
    return dict(root=root, config=config, params=params, adapters=adapters)


def test_an_export_reads_back_bit_for_bit_with_the_same_logits(exported):
    config, params = exported["config"], exported["params"]
    assert len(list((exported["root"] / "model").glob("model-*.safetensors"))) > 1  # sharded, with an index
    loaded = load_model(exported["root"] / "model", config)
    as_bf16 = jax.tree.map(lambda p: np.asarray(p.astype(jnp.bfloat16)), params)
    jax.tree.map(lambda got, want: np.testing.assert_array_equal(np.asarray(got).astype(ml_dtypes.bfloat16), want), loaded, as_bf16)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(loaded))
    tokens = random_tokens(config.num_embed, 24)
    bf16_params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), as_bf16)
    np.testing.assert_array_equal(jax_logits(config, loaded, tokens), jax_logits(config, bf16_params, tokens))


def test_an_exported_adapter_reads_back_exactly(exported):
    loaded = load_adapter(exported["root"] / "adapter", exported["config"])
    jax.tree.map(lambda got, want: np.testing.assert_array_equal(np.asarray(got), np.asarray(want)), loaded, exported["adapters"])


def test_a_block_reads_only_its_rows(exported):
    """A process reads the rows of its shards: half the embedding's rows, or half of o_proj's (embed) axis, is
    half the tensor's bytes."""
    config = exported["config"]
    found = hf_load.ModelDirectory(str(exported["root"] / "model"))
    tensors = {tensor.name: tensor for tensor in hf_weights.model_tensors(config)}
    full = np.asarray(exported["params"]["embedder"]["input_embedding"]).astype(ml_dtypes.bfloat16)
    half = config.num_embed // 2
    block = found.tensors.part_block(tensors[hf_weights.EMBEDDING], hf_weights.EMBEDDING, full.shape,
                                     (slice(half, None), slice(None)))
    np.testing.assert_array_equal(block, full[half:])
    assert found.tensors.bytes_read == full[half:].nbytes
    o_proj = "model.layers.1.self_attn.o_proj.weight"
    weight = np.asarray(exported["params"]["layer_1"]["attn"]["attn_vec_einsum"]["w"]).astype(ml_dtypes.bfloat16)
    before, embed = found.tensors.bytes_read, weight.shape[2]
    block = found.tensors.part_block(tensors[o_proj], o_proj, weight.shape, (slice(None), slice(None), slice(0, embed // 2)))
    np.testing.assert_array_equal(block, weight[:, :, : embed // 2])
    assert found.tensors.bytes_read - before == weight.nbytes // 2


def test_the_run_starts_from_the_directories(exported, tokenizer_path, prepared_dir):
    """--weights HF_DIR --lora-weights ADAPTER_DIR: the run's frozen base and first adapters are theirs."""
    root = exported["root"]
    # The tiny model (the run's --model): its export, and random adapters of it.
    tiny = models.model_config("tiny", vocab_size=exported["config"].num_embed)
    (root / "tiny").mkdir()
    tiny_params, tiny_adapters = random_params(tiny, seed=3), random_adapters(tiny, seed=4)
    from trainer.data.tokenizer import load_tokenizer

    export.write_model(root / "tiny", tiny, tiny_params, load_tokenizer(tokenizer_path), dtype="float32")
    (root / "tiny_adapter").mkdir()
    export.write_adapter(root / "tiny_adapter", tiny, tiny_adapters, rank=RANK, base_model="test", dtype="float32")
    config = parse_config(["--model", "tiny", "--weights", str(root / "tiny"), "--lora-rank", str(RANK), "--lora-weights",
                           str(root / "tiny_adapter"), "--tokenizer", str(tokenizer_path), "--data", str(prepared_dir)])
    adapters, base = models.initial_params(config, tiny, one_device, resuming=False)
    for got, want in ((base, tiny_params), (adapters, tiny_adapters)):
        jax.tree.map(lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)), got, want)


@pytest.fixture(scope="module")
def made(tmp_path_factory, tokenizer):
    """Gemma 3s made by transformers (random weights, the rich config), a PEFT adapter on one, and their logits."""
    if not pathlib.Path(HF_PYTHON).exists():
        pytest.skip(f"no Hugging Face check environment at {HF_PYTHON}: run `make .venv-hf/.installed` (or set HF_PYTHON)")
    root = tmp_path_factory.mktemp("made")
    # Without the final softcap, which Gemma 3 has not: transformers' multimodal class leaves it out.
    config = dataclasses.replace(rich_config(tokenizer.vocab_size), final_logit_softcap=None)
    ours = hf_config.model_config_json(config, dtype="float32", bos_id=2, eos_id=1, pad_id=0)
    text_config = {key: ours[key] for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_theta",
        "rope_local_base_freq", "rope_scaling", "final_logit_softcapping")}
    tokens = random_tokens(config.num_embed, 40, seed=5)
    vision = gemma3_config.tiny_vision(image_token_id=config.num_embed)
    pixel_values = np.random.default_rng(6).uniform(-1, 1, (2 * 2, 3, vision.image_size, vision.image_size)).astype(np.float32)
    np.save(root / "pixel_values.npy", pixel_values)
    images = {"pixel_values": str(root / "pixel_values.npy"), "mm_tokens_per_image": vision.soft_tokens,
              "image_token_index": vision.image_token_id,
              "vision_config": {"hidden_size": vision.width, "intermediate_size": vision.mlp_dim, "num_hidden_layers": vision.depth,
                                "num_attention_heads": vision.num_heads, "image_size": vision.image_size,
                                "patch_size": vision.patch_size, "vision_use_head": False}}
    cases = {
        "causal": {"multimodal": False},
        "multimodal": {"multimodal": True},
        "vision": {"multimodal": True, "images": images, "tokens": with_images(tokens, vision).tolist()},
        "sharded": {"multimodal": False, "max_shard_size": "200KB",
                    "adapter": {"r": RANK, "lora_alpha": 2 * RANK, "share_a": True, "out": str(root / "adapter")}},
        "unshared": {"multimodal": False, "adapter": {"r": RANK, "lora_alpha": RANK, "share_a": False,
                                                       "out": str(root / "unshared_adapter")}},
    }
    plan = {"made": [{"tokens": tokens.tolist(), **case, "text_config": text_config, "out": str(root / name),
                      "logits": str(root / f"{name}.npy")} for name, case in cases.items()]}
    (root / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run([HF_PYTHON, str(REPO / "tests" / "hf_check.py"), str(root / "plan.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(root=root, config=config, tokens=tokens, hf={name: np.load(root / f"{name}.npy") for name in cases},
                vision=vision, vision_tokens=np.asarray(cases["vision"]["tokens"]),
                images=pixel_values.reshape(2, 2, *pixel_values.shape[1:]).transpose(0, 1, 3, 4, 2))


def with_images(tokens, vision, start=5, end=6):
    """Rows with two images each: <start_of_image>, the image's tokens, <end_of_image>, between text
    (`start` and `end` stand for the markers, which are text tokens to the model)."""
    rows = tokens.copy()
    for offset in (8, 24):
        rows[:, offset] = start
        rows[:, offset + 1: offset + 1 + vision.soft_tokens] = vision.image_token_id
        rows[:, offset + 1 + vision.soft_tokens] = end
    return rows


@pytest.mark.parametrize("name", ["causal", "multimodal"])
def test_a_transformers_gemma3_gives_transformers_logits(made, name):
    config = json.loads((made["root"] / name / "config.json").read_text())
    assert config["architectures"] == [{"causal": "Gemma3ForCausalLM", "multimodal": "Gemma3ForConditionalGeneration"}[name]]
    params = load_model(made["root"] / name, made["config"])
    difference = max_diff(jax_logits(made["config"], params, made["tokens"]), made["hf"][name])
    print(f"{name}: max abs logit difference {difference:.2e}")
    assert difference < TOLERANCE


def test_a_transformers_gemma3_with_images_gives_transformers_logits(made):
    """The vision tower, the projector, the soft tokens at the image tokens and the bidirectional attention
    among an image's tokens, against transformers' Gemma3ForConditionalGeneration given pixel values."""
    vision, tokens = made["vision"], made["vision_tokens"]
    params = load_model(made["root"] / "vision", made["config"], vision=vision)
    logits = jax_logits(made["config"], params, tokens, vision=vision, images=made["images"])
    difference = max_diff(logits, made["hf"]["vision"])
    print(f"images: max abs logit difference {difference:.2e}")
    assert difference < TOLERANCE
    # the text after an image reads it: other pixels change the logits past the first image
    other = jax_logits(made["config"], params, tokens, vision=vision, images=made["images"][:, ::-1])
    assert max_diff(other[:, 9:], logits[:, 9:]) > 100 * TOLERANCE


def test_googles_names_of_the_vision_tower_read_the_same(made, tmp_path):
    """Google's published checkpoints keep the tower under `vision_tower.vision_model.` (transformers 5.23 saves
    it under `vision_tower.`): the same tensors under those names load the same weights."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(made["root"] / "vision" / "model.safetensors")
    assert any(name.startswith("vision_tower.encoder.") for name in tensors)
    renamed = {name.replace("vision_tower.", "vision_tower.vision_model.", 1): value for name, value in tensors.items()}
    (tmp_path / "google").mkdir()
    shutil.copy(made["root"] / "vision" / "config.json", tmp_path / "google")
    save_file(renamed, tmp_path / "google" / "model.safetensors", metadata={"format": "pt"})
    ours, theirs = (load_model(directory, made["config"], vision=made["vision"]) for directory in (tmp_path / "google", made["root"] / "vision"))
    jax.tree.map(lambda got, want: np.testing.assert_array_equal(np.asarray(got), np.asarray(want)), ours, theirs)


@pytest.mark.parametrize("name, change, message", [
    ("causal", {}, "a text-only Gemma 3 (Gemma3ForCausalLM), --model tiny reads images; give a Gemma3ForConditionalGeneration directory"),
    ("vision", {"depth": 3}, "its image encoder's depth is 2, --model tiny has 3; pass the --model the checkpoint is"),
    ("vision", {"soft_tokens": 16}, "its image encoder's soft_tokens is 4, --model tiny has 16; pass the --model the checkpoint is"),
])
def test_a_directory_that_does_not_fit_the_image_encoder_is_one_line(made, name, change, message):
    directory = made["root"] / name
    with pytest.raises(UserError, match=f"^--weights {directory}: {re.escape(message)}$"):
        load_model(directory, made["config"], vision=dataclasses.replace(made["vision"], **change))


def test_an_imported_vision_model_exports_back_the_same(made, tokenizer, tmp_path):
    """Read, then exported as Gemma3ForConditionalGeneration: the same tensors as transformers saved (in Google's
    layout: `vision_tower.vision_model.`), and transformers gives the same logits with images from it."""
    from safetensors.numpy import load_file

    vision = made["vision"]
    export.write_model(tmp_path, made["config"], load_model(made["root"] / "vision", made["config"], vision=vision),
                       tokenizer, dtype="float32", vision=vision)
    ours = load_file(tmp_path / "model.safetensors")
    theirs = {name.replace("vision_tower.", hf_weights.VISION_TOWER, 1): value
              for name, value in load_file(made["root"] / "vision" / "model.safetensors").items()}
    assert sorted(ours) == sorted(theirs)
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)

    images = {"pixel_values": str(made["root"] / "pixel_values.npy"), "image_token_index": vision.image_token_id}
    plan = {"models": [{"model": str(tmp_path), "tokens": made["vision_tokens"].tolist(), "images": images,
                        "out": str(tmp_path / "logits.npy")}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run([HF_PYTHON, str(REPO / "tests" / "hf_check.py"), str(tmp_path / "plan.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    difference = max_diff(np.load(tmp_path / "logits.npy"), made["hf"]["vision"])
    print(f"export with images: max abs logit difference {difference:.2e}")
    assert difference < TOLERANCE


def test_our_vision_language_adapter_with_its_projector_on_our_base_gives_peft_logits_with_images(made, tokenizer, tmp_path):
    """A vision-language LoRA run's adapter (its LoRA on Gemma3ForConditionalGeneration's text layers, its trained
    projector saved whole as modules_to_save) and its base, exported: PEFT puts the adapter on transformers' model
    of the base and gives our logits with images."""
    vision = made["vision"]
    config = dataclasses.replace(made["config"], vision=vision)
    base = random_params(config, seed=3)
    rng = np.random.default_rng(4)
    projector = {key: jax.tree.map(lambda w: w + jnp.asarray(0.1 * rng.standard_normal(w.shape), w.dtype), base["embedder"][key])
                 for key in ("mm_input_projection", "mm_soft_embedding_norm")}
    adapters = random_adapters(config)
    (tmp_path / "base").mkdir(), (tmp_path / "adapter").mkdir()
    export.write_model(tmp_path / "base", made["config"], base, tokenizer, dtype="float32", vision=vision)
    export.write_adapter(tmp_path / "adapter", config, models.join_lora({"embedder": projector}, adapters), rank=RANK,
                         base_model="test", dtype="float32")
    merged = models.merge_lora_into_base(models.join_lora(base, adapters))
    merged["embedder"] = {**merged["embedder"], **projector}  # the trained projector over the base's
    images = {"pixel_values": str(made["root"] / "pixel_values.npy"), "image_token_index": vision.image_token_id}
    plan = {"models": [{"model": str(tmp_path / "base"), "adapter": str(tmp_path / "adapter"), "images": images,
                        "tokens": made["vision_tokens"].tolist(), "out": str(tmp_path / "logits.npy")}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run([HF_PYTHON, str(REPO / "tests" / "hf_check.py"), str(tmp_path / "plan.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ours = jax_logits(made["config"], merged, made["vision_tokens"], vision=vision, images=made["images"])
    difference = max_diff(np.load(tmp_path / "logits.npy"), ours)
    print(f"vision adapter on its base with images: max abs logit difference {difference:.2e}")
    assert difference < 1e-4


def test_an_adapter_saving_modules_this_trainer_cannot_hold_is_one_line(tmp_path):
    """modules_to_save other than a vision-language run's projector and encoder, or those on a model without
    images, stop with one line naming the adapter."""
    config = models.model_config("tiny", vocab_size=300, images=True)
    shapes = jax.eval_shape(lambda: models.init_params(config, seed=0))
    trained = models.join_lora({"embedder": {key: shapes["embedder"][key] for key in ("mm_input_projection", "mm_soft_embedding_norm")}},
                               jax.eval_shape(lambda: models.init_adapters(config, seed=0, lora_rank=RANK)))
    export.write_adapter(tmp_path, config, jax.tree.map(lambda leaf: np.zeros(leaf.shape, np.float32), trained), rank=RANK,
                         base_model="test", dtype="float32")
    text = models.model_config("tiny", vocab_size=300)
    adapters = jax.eval_shape(lambda: models.init_adapters(text, seed=0, lora_rank=RANK))
    with pytest.raises(UserError, match=f"^--lora-weights {tmp_path}: the adapter saves multi_modal_projector whole, parts of "
                                        "an image model, and this run's model reads no images; train on data with images$"):
        hf_load.AdapterDirectory(str(tmp_path)).check(text, adapters, lora_rank=RANK)
    adapter_config = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**adapter_config, "modules_to_save": ["lm_head"]}))
    with pytest.raises(UserError, match=re.escape(f"--lora-weights {tmp_path}: adapter_config.json's modules_to_save is "
                                                  "['lm_head']; this trainer's LoRA takes only multi_modal_projector and "
                                                  "vision_tower saved whole")):
        hf_load.AdapterDirectory(str(tmp_path))


def test_a_peft_adapter_on_a_sharded_model_gives_peft_logits(made):
    directory = made["root"] / "sharded"
    assert (directory / "model.safetensors.index.json").exists() and len(list(directory.glob("model-*.safetensors"))) > 1
    base = load_model(directory, made["config"])
    adapters = load_adapter(made["root"] / "adapter", made["config"])
    logits = jax_logits(made["config"], models.join_lora(base, adapters), made["tokens"], lora_rank=RANK)
    difference = max_diff(logits, made["hf"]["sharded"])
    print(f"peft: max abs logit difference {difference:.2e}")
    assert difference < TOLERANCE
    assert max_diff(jax_logits(made["config"], base, made["tokens"]), made["hf"]["sharded"]) > 100 * TOLERANCE


def test_an_adapter_with_separate_k_and_v_a_is_refused(made):
    with pytest.raises(UserError, match="k_proj.lora_A.weight and .*v_proj.lora_A.weight differ"):
        load_adapter(made["root"] / "unshared_adapter", made["config"])


def test_each_process_of_a_job_reads_only_its_shards_bytes(exported, tmp_path):
    """Two processes, FSDP over their four devices: each holds the directory's values in its shards and
    reads part of the bytes (the rows of its blocks; replicated small weights and blocks whose rows are
    every row, as down_proj's split by its columns, in full)."""
    import os
    import socket
    import sys

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    environment = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    records = [tmp_path / f"process{i}.json" for i in range(2)]
    processes = [subprocess.Popen([sys.executable, "-m", "tests.trainer.hf.distributed_load", str(record),
                                   str(exported["root"] / "model"), str(exported["config"].num_embed), str(port), "2", str(i)],
                                  cwd=REPO, env=environment, stderr=subprocess.PIPE, text=True)
                 for i, record in enumerate(records)]
    try:
        errors = [process.communicate(timeout=300)[1] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert [process.returncode for process in processes] == [0, 0], errors
    for record in map(lambda path: json.loads(path.read_text()), records):
        print(f"read {record['bytes_read']} of {record['bytes']} bytes ({record['bytes_read'] / record['bytes']:.0%})")
        assert record["matches"] and record["devices"] == 4 and record["split_arrays"] > 0
        assert record["bytes_read"] < 0.8 * record["bytes"]  # 72%: the embedding and gate/up rows halved


def test_a_cut_short_shard_is_named(exported, tmp_path):
    shutil.copytree(exported["root"] / "model", tmp_path / "model")
    shard = sorted((tmp_path / "model").glob("model-*.safetensors"))[-1]
    with shard.open("r+b") as file:
        file.truncate(shard.stat().st_size - 2)
    with pytest.raises(UserError, match=f"^--weights {tmp_path / 'model'}: {shard.name} is no safetensors file this trainer "
                                        r"reads: tensor .*: data_offsets \[\d+, \d+\] reach past the file's \d+ data bytes \(is it cut short\?\)$"):
        hf_load.ModelDirectory(str(tmp_path / "model"))
