"""The model: the Gemma 3 layers as the step runs them, the model and weights a run starts from, the
loss, the parameters on disk, the compute dtype, sampling. Imports trainer's top (contract, errors,
config), trainer.data and trainer.gemma3 (whose modules run on trainer.model.layers); nothing of
trainer.run or of what drives a run.
"""
