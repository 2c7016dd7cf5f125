"""What a run costs and reports beyond its loss: FLOPs per token, chip peaks, tok/s and MFU, the per-chip
memory estimate (`python -m trainer.measure.memory`), the loss plot (`python -m trainer.measure.plot`),
and goodput: each attempt's timed events (run_events) and where the paid time went (goodput_accounting)."""
