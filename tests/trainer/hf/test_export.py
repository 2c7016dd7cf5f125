"""The Hugging Face export computes what the trainer's model computes: transformers (and PEFT on the
exported base) give the JAX model's logits on the same tokens, and a broken weight mapping does not.

transformers runs in .venv-hf (tests/hf_check.py, one subprocess for every export); without it these
tests skip with how to make it. The CLI's bad inputs need no transformers.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from PIL import Image
from safetensors.numpy import load_file, save_file

from trainer import contract, loop
from trainer.data import images, vision_corpus
from trainer.data.vision_corpus import write_vision_corpus
from trainer.model import models, sampling

from trainer import export
from trainer.hf import processor as hf_processor, tokenizer as hf_tokenizer
from trainer.data import tokenizer as tokenizer_lib
from trainer.config import parse_config

REPO = pathlib.Path(__file__).resolve().parents[3]
HF_PYTHON = os.environ.get("HF_PYTHON") or str(REPO / ".venv-hf" / "bin" / "python")
# float32 on both sides: the exports agree with JAX to 6.2e-6 at most (the rich config; 4e-7 the tiny
# model's; logits up to ~7); a swapped or transposed weight is off by 0.2 or more.
TOLERANCE = 1e-5
FAST = ["--seq-len", "64", "--batch-size", "8", "--eval-fraction", "0", "--no-samples", "--steps", "3", "--lr", "3e-3"]
TEXT = "Once upon a time,  a little dog ran.\nThe end! é 日本"


def train(workdir, prepared_dir, tokenizer_path, *extra):
    loop.train(parse_config(["--model", "tiny", "--weights", "random", "--data", str(prepared_dir), "--tokenizer",
                             str(tokenizer_path), "--workdir", str(workdir), *FAST, *extra]))
    return workdir


def jax_logits(model_config, params, tokens, *, lora_rank=0, vision=None, images=None):
    """Each row one document from position 0 (with `vision`, its images at its image tokens), decoded with the
    tied embedding (and the final softcap)."""
    model = models.build_model(dataclasses.replace(model_config, vision=vision), dtype=jnp.float32, lora_rank=lora_rank)
    if images is None:
        hidden = model.apply({"params": params}, jnp.asarray(tokens))
    else:  # compiled whole: op by op, the image encoder's first run compiled each of its ops (11 s against 3)
        hidden = jax.jit(model.apply)({"params": params}, jnp.asarray(tokens), images=jnp.asarray(images))
    logits = jnp.einsum("bld,vd->blv", hidden, params["embedder"]["input_embedding"])
    cap = model_config.final_logit_softcap
    return np.asarray(logits if cap is None else jnp.tanh(logits / cap) * cap)


def random_tokens(vocab, length, seed=0):
    tokens = np.random.default_rng(seed).integers(4, vocab, size=(2, length))
    tokens[:, 0] = tokenizer_lib.BOS_ID
    return tokens


def rich_config(vocab):
    """Beyond the tiny model: grouped kv heads, a global layer after five local ones (its own RoPE base and
    linear scaling), a short window and a final logit softcap."""
    return dataclasses.replace(models.model_config("tiny", vocab_size=vocab), num_heads=4, num_kv_heads=2, num_layers=6,
                               sliding_window_size=8, global_scale_factor=8.0, final_logit_softcap=30.0)


def random_params(config, seed=1):
    """Random N(0, 0.1) weights of `config`'s model, norm scales included (so that (1 + w) against w would
    show). Drawn by numpy from the traced shapes: initialising the model would compile it (seconds a config)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: models.init_params(config, seed=0))
    return jax.tree.map(lambda leaf: jnp.asarray(0.1 * rng.standard_normal(leaf.shape), leaf.dtype), shapes)


def break_export(source: pathlib.Path, target: pathlib.Path, change) -> pathlib.Path:
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    change(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def swap_k_v(tensors):
    name = "model.layers.0.self_attn.{}_proj.weight"
    tensors[name.format("k")], tensors[name.format("v")] = tensors[name.format("v")], tensors[name.format("k")]


def transpose_o_proj(tensors):
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].T)


def chat_tokenizer(directory: pathlib.Path, corpus_path) -> pathlib.Path:
    """A SentencePiece model with Gemma's turn markers as pieces of their own."""
    path = directory / "chat.model"
    spm.SentencePieceTrainer.train(
        input=str(corpus_path), model_prefix=str(path.with_suffix("")), vocab_size=400, model_type="bpe",
        byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        input_sentence_size=20_000, minloglevel=2,
        user_defined_symbols=[hf_tokenizer.START_OF_TURN, hf_tokenizer.END_OF_TURN],
    )
    return path


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Tell a story"}]
GEMMA_CHAT = ("<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
              "<start_of_turn>user\nTell a story<end_of_turn>\n<start_of_turn>model\n")


PICTURE_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vision_corpus.QUESTION}]}]


def vision_tokenizer_files(root):
    """A vision-language export's tokenizer and processor files (a tokenizer trained on the generated image task,
    with the turn and image markers; the tiny model's image encoder), and a picture of another size than its images."""
    corpus = write_vision_corpus(root / "pictures" / "chat.jsonl", num_images=8)
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_lib.train_tokenizer(corpus, corpus.parent / "tokenizer.model", vocab_size=300))
    vision = models.vision_config("tiny", vocab_size=tokenizer.vocab_size)
    directory = root / "vision_tokenizer"
    directory.mkdir()
    hf_tokenizer.write_tokenizer_files(tokenizer, directory, image_token_id=vision.image_token_id)
    hf_processor.write_processor_files(directory, vision)
    picture = root / "picture.png"
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (37, 90, 3), dtype=np.uint8)).save(picture)
    return directory, picture


@pytest.fixture(scope="module")
def checked(tmp_path_factory, prepared_dir, tokenizer_path, corpus_path):
    """Every export, and what transformers computed from each (one subprocess)."""
    if not pathlib.Path(HF_PYTHON).exists():
        pytest.skip(f"no Hugging Face check environment at {HF_PYTHON}: run `make .venv-hf/.installed` (or set HF_PYTHON)")
    root = tmp_path_factory.mktemp("export")
    full = train(root / "full_run", prepared_dir, tokenizer_path)
    # LoRA on the full run's weights, as on a published model: its base is read, not initialised again (an
    # XLA compile) by the run and by each export of it.
    lora = train(root / "lora_run", prepared_dir, tokenizer_path, "--lora-rank", "4", "--weights",
                 str(full / "export" / "params"))
    for run, out, extra in ((full, "full", []), (lora, "merged", []), (lora, "adapter", ["--lora-export", "adapter"]),
                            (lora, "base", ["--lora-export", "base"])):
        assert export.main(["--run", str(run), "--format", "hf", "--out", str(root / out), "--dtype", "float32", *extra]) == 0

    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
    tiny = models.model_config("tiny", vocab_size=tokenizer.vocab_size)
    rich = rich_config(tokenizer.vocab_size)
    rich_params = random_params(rich)
    (root / "rich").mkdir()
    export.write_model(root / "rich", rich, rich_params, tokenizer, dtype="float32", max_shard_bytes=200_000)
    break_export(root / "full", root / "swapped_kv", swap_k_v)
    break_export(root / "full", root / "transposed_o", transpose_o_proj)
    chat_dir = root / "chat"
    chat_dir.mkdir()
    chat = tokenizer_lib.load_tokenizer(chat_tokenizer(root, corpus_path))
    hf_tokenizer.write_tokenizer_files(chat, chat_dir)
    vision_dir, picture = vision_tokenizer_files(root)

    tokens = random_tokens(tokenizer.vocab_size, 100)  # past the tiny model's window of 64
    rich_tokens = random_tokens(tokenizer.vocab_size, 40, seed=1)
    models_plan = {
        "full": (root / "full", None, tokens), "merged": (root / "merged", None, tokens),
        "peft": (root / "base", root / "adapter", tokens), "auto": (full / "export" / "hf", None, tokens),
        "rich": (root / "rich", None, rich_tokens),
        "swapped_kv": (root / "swapped_kv", None, tokens), "transposed_o": (root / "transposed_o", None, tokens),
    }
    plan = {
        "models": [{"model": str(model), "adapter": adapter and str(adapter), "tokens": t.tolist(), "out": str(root / f"{name}.npy")}
                   for name, (model, adapter, t) in models_plan.items()],
        "tokenizers": [{"dir": str(root / "full"), "text": TEXT, "out": str(root / "tokenizer.json.out")},
                       {"dir": str(chat_dir), "text": TEXT, "messages": MESSAGES, "out": str(root / "chat.json.out")}],
        "processors": [{"dir": str(vision_dir), "image": str(picture), "messages": PICTURE_MESSAGES, "out": str(root / "processor.json.out")}],
    }
    (root / "plan.json").write_text(json.dumps(plan))
    result = subprocess.run([HF_PYTHON, str(REPO / "tests" / "hf_check.py"), str(root / "plan.json")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    hf = {name: np.load(root / f"{name}.npy") for name in models_plan}

    full_params = export.run_weights(export.read_run(str(full)))[0]
    adapters, base, _ = export.run_weights(export.read_run(str(lora)))
    with_lora = models.join_lora(base, adapters)
    bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), full_params)
    expected = {
        "full": jax_logits(tiny, full_params, tokens),
        "lora": jax_logits(tiny, with_lora, tokens, lora_rank=4),
        "base": jax_logits(tiny, base, tokens),
        "auto": jax_logits(tiny, bf16, tokens),  # the run's own export is bfloat16: the same rounded weights
        "rich": jax_logits(rich, rich_params, rich_tokens),
    }
    return dict(root=root, hf=hf, expected=expected, adapters=adapters, tokenizer=tokenizer, chat=chat,
                tokenized=json.loads((root / "tokenizer.json.out").read_text()),
                chat_tokenized=json.loads((root / "chat.json.out").read_text()),
                processed=json.loads((root / "processor.json.out").read_text()), picture=picture,
                vision_tokenizer=tokenizer_lib.load_tokenizer(vision_dir / "tokenizer.model"))


def max_diff(a, b) -> float:
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("name, reference", [("full", "full"), ("merged", "lora"), ("peft", "lora"), ("auto", "auto"), ("rich", "rich")])
def test_transformers_computes_the_jax_logits(checked, name, reference):
    difference = max_diff(checked["hf"][name], checked["expected"][reference])
    print(f"{name}: max abs logit difference {difference:.2e}")
    assert difference < TOLERANCE


def test_the_lora_run_trained_its_adapters(checked):
    """LoRA B starts at 0: a merged export of untrained adapters would equal the base and prove nothing."""
    b = checked["adapters"]["layer_0"]["attn"]["kv_einsum"]["_LoRAEinsum_0"]["lora"]["b"]
    assert float(jnp.abs(b).max()) > 1e-3
    assert max_diff(checked["expected"]["lora"], checked["expected"]["base"]) > 100 * TOLERANCE


@pytest.mark.parametrize("broken", ["swapped_kv", "transposed_o"])
def test_a_broken_weight_mapping_fails_the_comparison(checked, broken):
    difference = max_diff(checked["hf"][broken], checked["expected"]["full"])
    print(f"{broken}: max abs logit difference {difference:.2e}")
    assert difference > 100 * TOLERANCE


def test_the_sharded_export_has_an_index_of_every_tensor(checked):
    rich = checked["root"] / "rich"
    index = json.loads((rich / "model.safetensors.index.json").read_text())
    files = sorted(path.name for path in rich.glob("model-*.safetensors"))
    assert len(files) > 1 and sorted(set(index["weight_map"].values())) == files
    assert not (rich / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == sum(t.nbytes for f in files for t in load_file(rich / f).values())


def test_auto_tokenizer_encodes_as_the_run_s_tokenizer(checked):
    tokenizer, tokenized = checked["tokenizer"], checked["tokenized"]
    assert tokenized["ids"] == tokenizer.encode(TEXT)
    assert tokenized["ids_with_special"] == [tokenizer.bos_id, *tokenizer.encode(TEXT)]


def test_a_chat_tokenizer_gets_gemma_s_chat_template_and_stops_at_end_of_turn(checked):
    chat, tokenized = checked["chat"], checked["chat_tokenized"]
    assert tokenized["chat"] == GEMMA_CHAT
    assert tokenized["ids"] == chat.encode(TEXT)
    generation = hf_tokenizer.generation_config_json(chat)
    assert generation["eos_token_id"] == [chat.eos_id, chat.processor.piece_to_id(hf_tokenizer.END_OF_TURN)]
    assert hf_tokenizer.generation_config_json(checked["tokenizer"])["eos_token_id"] == [checked["tokenizer"].eos_id]


def test_transformers_processor_prepares_a_picture_and_question_as_the_trainer_does(checked):
    """AutoProcessor reads a vision-language export's files as Gemma3Processor: the chat template renders the image
    part, the processor expands it into the image's tokens between the markers, and resizes and scales the picture,
    all as the trainer's samples prepare them (the ids, which tokens are the image's, the pixel values)."""
    processed, tokenizer = checked["processed"], checked["vision_tokenizer"]
    vision = models.vision_config("tiny", vocab_size=tokenizer.vocab_size)
    with Image.open(checked["picture"]) as picture:
        ids, pixels = sampling.picture_prompt(tokenizer, vision, picture, vision_corpus.QUESTION)
    assert processed["class"] == "Gemma3Processor"
    assert processed["input_ids"] == [ids], processed["text"]
    assert processed["token_type_ids"] == [[int(token == vision.image_token_id) for token in ids]]
    np.testing.assert_allclose(np.asarray(processed["pixel_values"][0]).transpose(1, 2, 0), images.normalised(pixels), atol=1e-6)


def test_the_adapter_config_scales_as_gm_lora_and_names_its_base(checked):
    config = json.loads((checked["root"] / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == config["lora_alpha"] == 4
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert "--lora-export base" in config["base_model_name_or_path"]  # a random base has no Hugging Face id
    model_config = json.loads((checked["root"] / "full" / "config.json").read_text())
    assert model_config["architectures"] == ["Gemma3ForCausalLM"] and model_config["torch_dtype"] == "float32"
    assert json.loads((checked["root"] / "full_run" / "export" / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_bad_invocations_are_one_line_naming_the_flag(tmp_path, capsys):
    assert export.main(["--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == contract.USER_ERROR
    assert "error: --run" in capsys.readouterr().err and not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    assert export.main(["--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == contract.USER_ERROR
    assert "error: --out" in capsys.readouterr().err and (tmp_path / "out" / "mine.txt").read_text() == "keep"
