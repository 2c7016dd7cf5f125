"""The model a run trains, assembled: its architecture and weights (random, official, a run's
checkpoint, a Hugging Face directory or adapter), LoRA split and merge, the parameters on disk, sampling.
Stands above trainer.gemma3, trainer.hf and trainer.nn and imports them, trainer.data and trainer's top
(contract, errors, config); nothing of trainer.run or of what drives a run.
"""
