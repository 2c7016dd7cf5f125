"""Hugging Face: a run as a Gemma3ForCausalLM directory or PEFT adapter (`python -m trainer.hf.export`),
its config, weight names and tokenizer files, and `python -m trainer.hf.sample` (runs in .venv-hf, without JAX)."""
