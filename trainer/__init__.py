"""The JAX fine-tuning trainer that runs in the container (and, with a tiny model, on a laptop CPU).

Kept free of heavy imports so that `workloads` can read `trainer.contract` without JAX.
"""
