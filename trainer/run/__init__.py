"""One run on the chips: the mesh and its processes, the jit step, the compiler's memory figures, the
chip's peaks, checkpoints, preemption, what a run reports. Imports trainer's top (contract, errors,
config, shared_files), trainer.data, trainer.nn and trainer.model (the step's model and loss, the
checkpoints' parameter files); not what drives a run (loop, generate, export, measure).
"""
