"""Loads Hugging Face exports with transformers (and PEFT) on CPU and writes what they compute.

Runs in .venv-hf (Python 3.11, CPU torch; requirements-hf.txt), never in the trainer's environment:
tests/trainer/hf/test_export.py writes a plan, runs `HF_PYTHON tests/hf_check.py PLAN`, and compares
the results with the JAX model. The plan (JSON):
  {"models": [{"model": DIR, "adapter": DIR or null, "tokens": [[id, ...], ...], "out": FILE.npy}, ...],
   "tokenizers": [{"dir": DIR, "text": STR, "messages": [...] or null, "out": FILE.json}, ...]}
Each model's float32 logits [rows, tokens, vocab] go to its .npy (positions 0.., no padding); each
tokenizer's ids of `text` (with and without special tokens) and, given messages, its chat
template's text go to its .json.
"""

import json
import sys

import numpy as np
import torch
import transformers


def logits(model_dir: str, adapter_dir: str | None, tokens: list[list[int]]) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    if adapter_dir:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens)).logits.float().numpy()


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


def main(plan_path: str) -> None:
    plan = json.loads(open(plan_path, encoding="utf-8").read())
    for case in plan.get("models", []):
        np.save(case["out"], logits(case["model"], case.get("adapter"), case["tokens"]))
    for case in plan.get("tokenizers", []):
        with open(case["out"], "w", encoding="utf-8") as out:
            json.dump(tokenized(case["dir"], case["text"], case.get("messages")), out)


if __name__ == "__main__":
    main(sys.argv[1])
