"""Hugging Face formats: a Gemma3ForCausalLM directory's config, weight names, safetensors files and
tokenizer files, such directories and PEFT adapters read as a run's starting weights (trainer.hf.load),
published versions (`python -m trainer.hf.publish`) and `python -m trainer.hf.sample` (runs in .venv-hf,
without JAX). Below the model's assembly: imports trainer's top, trainer.data and trainer.gemma3's
config only. Writing a run as such a directory is trainer.export, which drives the model.
"""
