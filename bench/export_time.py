"""`python -m bench.export_time [--model tiny|gemma3-270m] [--dtype bfloat16|float32]`: how long the
Hugging Face export (trainer.export.write_model) of a randomly initialised model takes, and its size.

Random weights: the export's time depends on the tensors' sizes, not their values.
"""

import argparse
import pathlib
import sys
import tempfile
import time

from trainer import export
from trainer.data import tokenizer as tokenizer_lib
from trainer.data.corpus import write_corpus
from trainer.model import models
from trainer.run.mesh import jax_entry_point


@jax_entry_point("bench.export_time: ")
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.export_time")
    parser.add_argument("--model", default="tiny", choices=("tiny", "gemma3-270m"))
    parser.add_argument("--dtype", default="bfloat16", choices=tuple(export.DTYPES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        tokenizer_path = tokenizer_lib.train_tokenizer(write_corpus(scratch / "corpus.txt", num_stories=400, seed=0),
                                                       scratch / "tokenizer.model")
        tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
        config = models.model_config(args.model, vocab_size=tokenizer.vocab_size)
        params = models.init_params(config, seed=0)
        out = scratch / "hf"
        out.mkdir()
        start = time.perf_counter()
        export.write_model(out, config, params, tokenizer, dtype=args.dtype)
        took = time.perf_counter() - start
        size = sum(path.stat().st_size for path in out.iterdir())
    print(f"{args.model} ({args.dtype}): export {took:.2f} s, {size / 1e6:.1f} MB written, {size / 1e6 / took:.0f} MB/s")


if __name__ == "__main__":
    sys.exit(main())
