"""`python -m trainer.hf.sample --model DIR --prompt TEXT`: answer a prompt with an exported model
loaded by the Hugging Face `transformers` library, as a serving stack loads it.

Run it in the environment that has transformers and torch (`.venv-hf`, made by `make test` or
`make chat-demo`; never the TPU image): it imports nothing else of the trainer. The prompt goes
through the export's own chat template when it has one (the model's turn is generated until
`<end_of_turn>`), otherwise it is continued as plain text. Greedy, so the answer is repeatable.
With `--image`, each prompt is asked about each picture, a user turn of the picture and the prompt, through the
export's Gemma3Processor (a vision-language export with its processor files, trainer.hf.processor).
"""

import argparse
import pathlib
import sys

_USER_ERROR = 2  # trainer.contract.USER_ERROR, without importing the trainer (and its JAX) here


def _parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.hf.sample", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=pathlib.Path, help="a Hugging Face model directory (trainer.export's output)")
    parser.add_argument("--prompt", required=True, action="append", help="a user turn; give it several times for several prompts")
    parser.add_argument("--image", action="extend", nargs="+", type=pathlib.Path, default=[],
                        help="pictures to ask each prompt about")
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


def picture_answers(model_dir: pathlib.Path, prompts: list[str], pictures: list[pathlib.Path], *,
                    max_new_tokens: int) -> list[tuple[pathlib.Path, str, str]]:
    """(picture, prompt, the model's greedy answer) for each picture and prompt, read by the export's processor."""
    import torch
    import transformers
    from PIL import Image

    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    replies = []
    for picture in pictures:
        with Image.open(picture) as opened:
            image = opened.convert("RGB")
        for prompt in prompts:
            turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            text = processor.apply_chat_template(turn, add_generation_prompt=True)
            inputs = processor(text=text, images=[image], return_tensors="pt", add_special_tokens=False)  # BOS is the template's
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            replies.append((picture, prompt, processor.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()))
    return replies


def main(argv=None) -> int:
    args = _parse(argv)
    if not (args.model / "config.json").is_file():
        print(f"error: --model {args.model}: no config.json there; pass a directory written by "
              "python -m trainer.export (a run's WORKDIR/export/hf)", file=sys.stderr)  # fmt: skip
        return _USER_ERROR
    if args.image:
        missing = next((path for path in args.image if not path.is_file()), None)
        problem = (f"--image {missing}: no such file" if missing else None if (args.model / "preprocessor_config.json").is_file()
                   else f"--model {args.model}: no preprocessor_config.json there; --image needs a vision-language export")
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return _USER_ERROR
        for picture, prompt, reply in picture_answers(args.model, args.prompt, args.image, max_new_tokens=args.max_new_tokens):
            print(f"user: [{picture.name}] {prompt}\nmodel (transformers): {reply}")
        return 0
    for prompt, reply in zip(args.prompt, answers(args.model, args.prompt, max_new_tokens=args.max_new_tokens)):
        print(f"user: {prompt}\nmodel (transformers): {reply}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
