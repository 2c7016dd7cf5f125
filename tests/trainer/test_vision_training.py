"""Training with images (issue 53): chat rows whose messages hold images, prepared with their pixels, packed
with their soft tokens, and a tiny vision-language model that trains on them through `python -m trainer`."""

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from trainer import contract, export, generate, loop
from trainer.config import parse_config
from trainer.data import chat, vision_corpus
from trainer.data import loader as data_lib
from trainer.data import prepare as prepare_lib
from trainer.data.tokenizer import load_tokenizer, train_tokenizer
from trainer.data.vision_corpus import write_vision_corpus
from trainer.errors import UserError
from trainer.model import models, sampling
from trainer.nn import loss
from trainer.run import step
from trainer.run.metrics import read_metrics

def with_bad_image(folder, rows, *, line, image):
    """A generated image task of `rows` rows whose line `line` names `image` instead of its picture."""
    path = write_vision_corpus(folder / "chat.jsonl", num_images=rows)
    lines = path.read_text().splitlines()
    row = json.loads(lines[line - 1])
    row["messages"][0]["content"][0]["image"] = image
    lines[line - 1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def image_chat(tmp_path_factory):
    path = write_vision_corpus(tmp_path_factory.mktemp("images") / "chat.jsonl", num_images=48)
    tokenizer = load_tokenizer(train_tokenizer(path, path.parent / "tokenizer.model", vocab_size=300))
    return path, tokenizer


def test_the_tiny_vision_preset_trains_on_chat_rows_with_images_and_its_loss_falls(image_chat, tmp_path):
    """--preset tiny-vision (the tiny model with the tiny image encoder, random weights, a tokenizer trained on
    the data), shortened, on the generated image task; its encoder frozen, as a run's is by default (the preset
    trains it from a later step: trainer.run.optimizer's test)."""
    path, _ = image_chat
    args = ["--preset", "tiny-vision", "--data", str(path), "--workdir", str(tmp_path), "--seq-len", "64",
            "--batch-size", "8", "--steps", "16", "--warmup-steps", "2", "--log-interval", "1", "--eval-fraction", "0",
            "--no-samples", "--vision-encoder", "frozen"]
    loop.train(parse_config(args))
    resolved = json.loads((tmp_path / "config.json").read_text())
    tokenizer = load_tokenizer(tmp_path / "data" / "tokenizer.model")
    assert resolved["model_config"]["vision"]["image_token_id"] == tokenizer.vocab_size
    losses = [m["loss"] for m in read_metrics(tmp_path / "metrics.jsonl") if "loss" in m]
    assert len(losses) == 16 and np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
    exported = json.loads((tmp_path / "export" / "hf" / "config.json").read_text())
    assert exported["architectures"] == ["Gemma3ForConditionalGeneration"]
    # By default the image encoder stays as it started; the projector and the language model train.
    model_config = models.model_config("tiny", vocab_size=tokenizer.vocab_size, images=True)
    frozen_in = resolved["compute_dtype"]  # the frozen encoder is held, so exported, in the compute dtype
    start = dict(jax.tree_util.tree_flatten_with_path(jax.tree.map(lambda p: p.astype(frozen_in).astype(np.float32),
                                                                   models.init_params(model_config, seed=0)))[0])
    moved = {jax.tree_util.keystr(path).split("']")[0].strip("['") + ("/mm" if "mm_" in jax.tree_util.keystr(path) else "")
             for path, value in jax.tree_util.tree_flatten_with_path(ocp.PyTreeCheckpointer().restore(tmp_path / "export" / "params"))[0]
             if not np.array_equal(np.asarray(value), np.asarray(start[path]))}
    assert "vision_encoder" not in moved and {"embedder/mm", "layer_0"} <= moved, moved
    # python -m trainer.generate reads the run back (a text prompt: it has no image flag)
    assert generate.main(["--run", str(tmp_path), "--prompt", "What shape is this?", "--max-new-tokens", "4"]) == contract.OK


def test_image_tokens_are_masked_from_the_loss_and_meet_their_pixels(image_chat, tmp_path):
    """With --loss-on all every text token is trained, never an image's soft tokens (nor its markers); each row's
    images are the pictures its image tokens stand for, in order."""
    path, tokenizer = image_chat
    layout = models.image_layout("tiny", vocab_size=tokenizer.vocab_size)
    data = data_lib.open_data(str(path), tokenizer=tokenizer, cache_dir=str(tmp_path), loss_on=chat.ALL,
                              image_layout=layout)
    assert data.images["images"] == 48 and data.images_per_row == 1
    batch = next(data_lib.batches(data, seq_len=64, global_batch_size=8, seed=0, prefetch=False))
    image_targets = batch["target_tokens"] == layout.token_id
    assert image_targets.sum() == 8 * layout.soft_tokens  # one image a row, each of its soft tokens a target
    assert not batch["loss_mask"][image_targets].any()
    assert batch["loss_mask"][(batch["segment_ids"] > 0) & ~image_targets].mean() > 0.8
    assert batch["images"].shape == (8, 1, layout.size, layout.size, 3) and batch["images"].dtype == np.uint8
    # a shape on white: its corner white, some of it coloured
    assert (batch["images"][:, 0, 0, 0] == 255).all() and (batch["images"].min(axis=-1) < 100).any(axis=(2, 3)).all()
    # The loss reads the pictures: the same tokens with other pixels give another loss.
    config = models.model_config("tiny", vocab_size=tokenizer.vocab_size, images=True)
    params = models.init_params(config, seed=0)
    sums = jax.jit(lambda images: loss.loss_sums(models.build_model(config, dtype=np.float32), params,
                                                 {**batch, "images": images}, softcap=None, vocab_chunk=None)[0])
    assert abs(float(sums(batch["images"])) - float(sums(255 - batch["images"]))) > 1e-3


@pytest.mark.parametrize("bad,why", [("missing.png", "not found"), ("chat.jsonl", "not an image Pillow reads")])
def test_a_bad_image_is_one_line_naming_it_and_skip_leaves_its_row_out(tmp_path, image_chat, bad, why):
    _, tokenizer = image_chat
    path = with_bad_image(tmp_path, 6, line=3, image=bad)
    layout = models.image_layout("tiny", vocab_size=tokenizer.vocab_size)
    with pytest.raises(UserError) as refused:
        prepare_lib.prepare(path, tokenizer, tmp_path / "failed", image_layout=layout)
    assert f"data file {path} line 3: bad-image (image {path.parent / bad}: {why})" in str(refused.value)
    assert "--on-bad-row skip" in str(refused.value) and "\n" not in str(refused.value)
    lines = []
    meta = prepare_lib.prepare(path, tokenizer, tmp_path / "skipped", image_layout=layout, on_bad_row="skip",
                               warn=lines.append)
    assert lines == [f"data file {path} line 3: skipped (image {path.parent / bad}: {why})"]
    assert meta["documents"] == 5 and meta["skipped_rows"] == {"bad-image": 1} and meta["images"]["images"] == 5


def test_a_bad_image_stops_the_run_with_one_line(tmp_path, image_chat, capsys):
    from trainer.__main__ import main

    _, tokenizer = image_chat
    path = with_bad_image(tmp_path, 6, line=2, image="gone.png")
    args = ["--model", "tiny", "--weights", "random", "--data", str(path), "--tokenizer", tokenizer.path,
            "--workdir", str(tmp_path / "run"), "--seq-len", "64", "--batch-size", "2", "--steps", "1", "--no-samples"]
    assert main(args) == contract.USER_ERROR
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"image {path.parent / 'gone.png'}: not found); fix the row or pass --on-bad-row skip to leave "
                        "such rows out") and "\n" not in err, err


def test_a_document_with_images_is_never_cut_between_rows(image_chat, tmp_path):
    path, tokenizer = image_chat
    data = data_lib.open_data(str(path), tokenizer=tokenizer, cache_dir=str(tmp_path),
                              image_layout=models.image_layout("tiny", vocab_size=tokenizer.vocab_size))
    longest = int(data.lengths.max())
    with pytest.raises(UserError, match=f"--seq-len {longest - 1}: .*the longest {longest} tokens"):
        data_lib.batches(data, seq_len=longest - 1, global_batch_size=8, seed=0, prefetch=False)


def test_by_default_the_image_encoder_is_frozen_and_the_projector_trains_full_or_lora(image_chat):
    path, tokenizer = image_chat
    assert parse_config(["--model", "gemma3-4b", "--data", str(path)]).vision_encoder == "frozen"
    config = models.model_config("tiny", vocab_size=300, images=True)
    base = jax.eval_shape(lambda: models.init_params(config, seed=0))
    trained, frozen = models.trained_and_frozen(base)
    assert set(frozen) == {"vision_encoder"} and "mm_input_projection" in trained["embedder"]
    assert models.trained_and_frozen(base, train_encoder=True) == (base, None)
    trains_it = parse_config(["--model", "gemma3-4b", "--data", str(path), "--vision-encoder", "trained"])
    assert step.abstract_params(trains_it, config) == (base, None)
    adapters = jax.eval_shape(lambda: models.init_adapters(config, seed=1, lora_rank=4))
    trained, frozen = models.trained_and_frozen(base, adapters)
    assert set(trained["embedder"]) == {"mm_soft_embedding_norm", "mm_input_projection"}
    assert "input_embedding" in frozen["embedder"] and "vision_encoder" in frozen and "vision_encoder" not in trained
    assert jax.tree.structure(models.join_lora(frozen, trained)) == jax.tree.structure(models.join_lora(base, adapters))


def test_a_vision_language_model_is_asked_about_each_picture_and_its_right_answers_counted(image_chat, monkeypatch):
    """The samples of a vision-language run: answers to pictures it never trained on, and how many are right. The
    decoder is stood in for: it records what it is shown and always says "A red circle."."""
    _, tokenizer = image_chat
    config = models.model_config("tiny", vocab_size=tokenizer.vocab_size, images=True)
    shown = []

    def decoder(model, params, prompt_ids, **kwargs):
        shown.append((prompt_ids, kwargs["images"]))
        return tokenizer.encode("A red circle.")

    monkeypatch.setattr(sampling, "generate_ids", decoder)
    monkeypatch.setattr(sampling, "HELD_OUT_PICTURES", 12)
    lines = sampling.sample_text(models.build_model(config, dtype=np.float32), None, tokenizer).splitlines()
    held_out = list(vision_corpus.pictures(12, sampling.HELD_OUT_SEED))
    assert lines[:sampling.SAMPLE_PICTURES] == [f"[{i + 1}] a picture of {right[2:-1].lower()}: What shape is this? -> "
                                                "A red circle." for i, (_, right) in enumerate(held_out[:4])]
    assert lines[-1] == f"{sum(right == 'A red circle.' for _, right in held_out)} of 12 held-out pictures answered right"
    vision = config.vision
    for (prompt_ids, pixels), (picture, _) in zip(shown, held_out, strict=True):
        assert prompt_ids.count(vision.image_token_id) == vision.soft_tokens
        assert pixels.shape == (1, 1, vision.image_size, vision.image_size, 3)
        assert np.array_equal(pixels[0, 0], np.asarray(picture))  # drawn at the encoder's size: no resampling



def test_a_vision_language_lora_run_s_adapter_with_its_projector_on_its_base_reads_back_as_the_run_s_model(
        image_chat, tmp_path, capsys):
    """The projector trains beside the adapters: the PEFT adapter saves it whole (modules_to_save), its LoRA under
    Gemma3ForConditionalGeneration's text layers, on the base with its own projector and encoder; our import of
    both gives the run's logits with images. Only --publish-parts base stops (one line, before training): the
    run does not keep the base's projector, trainer.export writes that base."""
    from safetensors.numpy import load_file

    from tests.trainer.hf.test_export import jax_logits, max_diff
    from tests.trainer.hf.test_import import with_images
    from trainer.__main__ import main

    path, tokenizer = image_chat
    run, out = tmp_path / "run", tmp_path / "out"
    args = ["--model", "tiny", "--weights", "random", "--data", str(path), "--tokenizer", tokenizer.path, "--lora-rank", "4",
            "--workdir", str(run), "--seq-len", "64", "--batch-size", "2", "--steps", "2", "--no-samples",
            "--compute-dtype", "float32", "--lr", "0.01", "--warmup-steps", "0", "--eval-fraction", "0"]
    assert main([*args, "--publish-parts", "hf,base"]) == contract.USER_ERROR
    error = capsys.readouterr().err.strip()
    assert "--publish-parts hf,base" in error and "--lora-export base" in error and "\n" not in error, error
    assert not (run / "metrics.jsonl").exists()
    assert main([*args, "--publish-parts", "hf,adapter"]) == contract.OK
    for part in ("adapter", "base"):
        assert export.main(["--run", str(run), "--out", str(out / part), "--lora-export", part, "--dtype", "float32"]) == contract.OK
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["modules_to_save"] == ["multi_modal_projector"]
    names = set(load_file(out / "adapter" / "adapter_model.safetensors"))
    assert names == set(load_file(run / "export" / "adapter" / "adapter_model.safetensors"))
    assert {"base_model.model.model.multi_modal_projector.mm_input_projection_weight",
            "base_model.model.model.multi_modal_projector.mm_soft_emb_norm.weight",
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"} <= names
    assert all(n.startswith(("base_model.model.model.language_model.layers.", "base_model.model.model.multi_modal_projector."))
               for n in names), names
    base = json.loads((out / "base" / "config.json").read_text())
    assert base["architectures"] == ["Gemma3ForConditionalGeneration"]

    model_config = models.model_config("tiny", vocab_size=tokenizer.vocab_size, images=True)
    loaded = parse_config(["--model", "tiny", "--weights", str(out / "base"), "--lora-weights", str(out / "adapter"),
                           "--lora-rank", "4", "--data", str(path), "--tokenizer", tokenizer.path, "--workdir", str(tmp_path / "again")])
    models.check_weights(loaded, model_config)
    trained, frozen = models.initial_params(loaded, model_config, export._on_one_device, resuming=False)
    ours = models.merge_lora_into_base(models.join_lora(frozen, trained))
    runs = ocp.PyTreeCheckpointer().restore(run / "export" / "params")
    start = models.init_params(model_config, seed=0)  # the run's base (--weights random)
    assert not np.allclose(runs["embedder"]["mm_input_projection"]["w"], start["embedder"]["mm_input_projection"]["w"])
    vision = model_config.vision
    tokens = with_images(np.random.default_rng(0).integers(7, tokenizer.vocab_size, size=(2, 40)), vision)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 2, vision.image_size, vision.image_size, 3)).astype(np.float32)
    logits = [jax_logits(model_config, params, tokens, vision=vision, images=images) for params in (ours, runs)]
    assert max_diff(*logits) < 1e-5, max_diff(*logits)
