"""GKE's multi-tier checkpointing (MTC) from the trainer's side: JAX joining the job through the node's
volume, and the local tier saved through Orbax's replicator manager. Imports the run's layer (trainer.run)
and below; trainer.loop imports it."""
