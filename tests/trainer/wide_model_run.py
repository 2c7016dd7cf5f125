"""`python -m tests.trainer.wide_model_run MODULE ARGS...`: `python -m MODULE ARGS...` (trainer or
trainer.generate) with one more model in the catalog, `tiny-wide`: the tiny architecture with
WIDE_EMBEDDINGS rows, more than a test's 512-piece tokenizer has, as Gemma's 262,144 rows are for a
tokenizer of the user's own. The catalog is the trainer's one table of models, read when the
trainer parses its flags, so the entry point runs unchanged."""

import runpy
import sys

from trainer.gemma3 import config as gemma3_config

MODEL = "tiny-wide"
WIDE_EMBEDDINGS = 4096


def main(module: str, argv: list[str]) -> None:
    gemma3_config.MODELS[MODEL] = gemma3_config.tiny(WIDE_EMBEDDINGS)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
