"""`python -m trainer.hf.sample --model DIR --prompt TEXT`: answer a prompt with an exported model
loaded by the Hugging Face `transformers` library, as a serving stack loads it.

Run it in the environment that has transformers and torch (`.venv-hf`, made by `make test` or
`make chat-demo`; never the TPU image): it imports nothing else of the trainer. The prompt goes
through the export's own chat template when it has one (the model's turn is generated until
`<end_of_turn>`), otherwise it is continued as plain text. Greedy, so the answer is repeatable.
"""

import argparse
import pathlib
import sys

_USER_ERROR = 2  # trainer.contract.USER_ERROR, without importing the trainer (and its JAX) here


def _parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.hf.sample", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=pathlib.Path, help="a Hugging Face model directory (trainer.export's output)")
    parser.add_argument("--prompt", required=True, action="append", help="a user turn; give it several times for several prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    return parser.parse_args(argv)


def answers(model_dir: pathlib.Path, prompts: list[str], *, max_new_tokens: int) -> list[str]:
    """The model's greedy answer to each prompt, special tokens left out; never an id the tokenizer lacks
    (the model's embedding table may have more rows than the tokenizer has pieces)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    beyond_tokenizer = list(range(len(tokenizer), model.config.vocab_size)) or None
    replies = []
    for prompt in prompts:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, suppress_tokens=beyond_tokenizer)
        replies.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
    return replies


def main(argv=None) -> int:
    args = _parse(argv)
    if not (args.model / "config.json").is_file():
        print(f"error: --model {args.model}: no config.json there; pass a directory written by "
              "python -m trainer.export (a run's WORKDIR/export/hf)", file=sys.stderr)  # fmt: skip
        return _USER_ERROR
    for prompt, reply in zip(args.prompt, answers(args.model, args.prompt, max_new_tokens=args.max_new_tokens)):
        print(f"user: {prompt}\nmodel (transformers): {reply}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
