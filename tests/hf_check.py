"""Loads Hugging Face exports with transformers (and PEFT) on CPU and writes what they compute.

Runs in .venv-hf (Python 3.11, CPU torch; requirements-hf.txt), never in the trainer's environment:
tests/trainer/hf/test_export.py writes a plan, runs `HF_PYTHON tests/hf_check.py PLAN`, and compares
the results with the JAX model. The plan (JSON):
  {"models": [{"model": DIR, "adapter": DIR or null, "tokens": [[id, ...], ...], "out": FILE.npy,
               "images": {"pixel_values": FILE.npy, "image_token_index": ID} or absent}, ...],
   "tokenizers": [{"dir": DIR, "text": STR, "messages": [...] or null, "out": FILE.json}, ...],
   "processors": [{"dir": DIR, "image": FILE.png, "messages": [...], "out": FILE.json}, ...]}
Each model's float32 logits [rows, tokens, vocab] go to its .npy (positions 0.., no padding); each
tokenizer's ids of `text` (with and without special tokens) and, given messages, its chat
template's text go to its .json; each processor's (AutoProcessor's) class, chat template's text and inputs of the
messages with the image (input_ids, token_type_ids, pixel_values) go to its .json.

For the import tests (tests/trainer/hf/test_import.py), the plan's "made" entries come first: each
makes a random Gemma 3 with transformers' own classes, {"text_config": {...}, "multimodal": bool,
"max_shard_size": STR or null, "out": DIR}, a multimodal one with images given "images": {"vision_config": {...},
"mm_tokens_per_image", "image_token_index", "pixel_values": FILE.npy [images, 3, size, size]} (its logits then
read them, in order, at the image tokens, with Gemma 3's attention rule), and optionally a PEFT adapter on it, "adapter": {"r", "lora_alpha",
"share_a": bool, "out": DIR} (share_a: v_proj's lora_A is k_proj's and up_proj's gate_proj's, as this
trainer's LoRA keeps them); "logits": FILE.npy gets the model's (with the adapter's) logits of "tokens".
"""

import json
import sys

import numpy as np
import torch
import transformers


def inputs(tokens: list[list[int]], images: dict | None) -> dict:
    """The model's inputs: token ids and, given images, their pixel values and which tokens are images' (token_type_ids,
    as the processor gives them: those tokens see their whole image)."""
    ids = torch.tensor(tokens)
    if not images:
        return {"input_ids": ids}
    return {"input_ids": ids, "pixel_values": torch.tensor(np.load(images["pixel_values"])),
            "token_type_ids": (ids == images["image_token_index"]).long()}


def logits(model_dir: str, adapter_dir: str | None, tokens: list[list[int]], images: dict | None = None) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    if adapter_dir:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        return model(**inputs(tokens, images)).logits.float().numpy()


def made(case: dict) -> None:
    """A random Gemma 3 (and PEFT adapter) saved as transformers and PEFT save them, with its logits."""
    torch.manual_seed(0)
    text = transformers.Gemma3TextConfig(**case["text_config"])
    images = case.get("images")
    if case["multimodal"]:
        vision = {key: value for key, value in (images or {}).items() if key != "pixel_values"} or {
            "mm_tokens_per_image": 4, "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                                        "num_attention_heads": 2, "image_size": 28, "patch_size": 14}}
        config = transformers.Gemma3Config(text_config=text.to_dict(), **vision)
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:
        model = transformers.Gemma3ForCausalLM(text)
    with torch.no_grad():
        for parameter in model.parameters():  # norm scales too: (1 + w) against w would show
            parameter.normal_(0.0, 0.1)
    model.eval()
    model.save_pretrained(case["out"], max_shard_size=case.get("max_shard_size") or "5GB")
    adapter = case.get("adapter")
    if adapter:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(
            r=adapter["r"], lora_alpha=adapter["lora_alpha"], init_lora_weights=False,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        if adapter["share_a"]:
            modules = dict(model.named_modules())
            with torch.no_grad():
                for name, module in modules.items():
                    for first, second in (("k_proj", "v_proj"), ("gate_proj", "up_proj")):
                        if name.endswith(second) and hasattr(module, "lora_A"):
                            module.lora_A["default"].weight.copy_(modules[name[: -len(second)] + first].lora_A["default"].weight)
        model.save_pretrained(adapter["out"])
        model.eval()
    with torch.no_grad():
        np.save(case["logits"], model(**inputs(case["tokens"], images)).logits.float().numpy())


def tokenized(directory: str, text: str, messages) -> dict:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    result = {
        "ids": tokenizer(text, add_special_tokens=False)["input_ids"],
        "ids_with_special": tokenizer(text)["input_ids"],
        "class": type(tokenizer).__name__,
    }
    if messages:
        result["chat"] = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return result


def processed(directory: str, image: str, messages) -> dict:
    from PIL import Image

    processor = transformers.AutoProcessor.from_pretrained(directory)
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    with Image.open(image) as picture:
        inputs = processor(text=text, images=[picture.convert("RGB")], add_special_tokens=False)
    return {"class": type(processor).__name__, "text": text,
            **{key: np.asarray(inputs[key]).tolist() for key in ("input_ids", "token_type_ids", "pixel_values")}}


def main(plan_path: str) -> None:
    plan = json.loads(open(plan_path, encoding="utf-8").read())
    for case in plan.get("made", []):
        made(case)
    for case in plan.get("models", []):
        np.save(case["out"], logits(case["model"], case.get("adapter"), case["tokens"], case.get("images")))
    for case in plan.get("tokenizers", []):
        with open(case["out"], "w", encoding="utf-8") as out:
            json.dump(tokenized(case["dir"], case["text"], case.get("messages")), out)
    for case in plan.get("processors", []):
        with open(case["out"], "w", encoding="utf-8") as out:
            json.dump(processed(case["dir"], case["image"], case["messages"]), out)


if __name__ == "__main__":
    main(sys.argv[1])
