"""Hugging Face: a run as a Gemma3ForCausalLM directory or PEFT adapter (`python -m trainer.hf.export`),
such directories and adapters as a run's starting weights (trainer.hf.load), their config, weight names
and tokenizer files, and `python -m trainer.hf.sample` (runs in .venv-hf, without JAX)."""
