"""What a run costs and reports beyond its loss: FLOPs per token, chip peaks, tok/s and MFU, the per-chip
memory estimate (`python -m trainer.measure.memory`) and the loss plot (`python -m trainer.measure.plot`)."""
