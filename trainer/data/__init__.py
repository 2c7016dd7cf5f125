"""The data side: dataset files as rows (text, JSONL, Parquet; chats), Gemma's chat template, the
SentencePiece tokenizer, preparation into packed ArrayRecord shards (`python -m trainer.data.prepare`),
the packed batch loader, and the generated corpora of the presets. Imports no JAX model code."""
