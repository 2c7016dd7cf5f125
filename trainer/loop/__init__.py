"""One training run, top to bottom: inputs, model, state (fresh or resumed), the step loop, export.

`training` holds train() itself, read in order; `inputs` resolves what a run reads, `step_loop` runs the steps,
`outputs` writes config.json and the export.
"""

from trainer.loop.inputs import DEMO_CONVERSATIONS, DEMO_STORIES, DEMO_VOCAB_SIZE, Inputs, resolve_inputs
from trainer.loop.outputs import export_final, publish_export, write_resolved_config
from trainer.loop.step_loop import Preempted, StepLoop
from trainer.loop.training import train

__all__ = ["DEMO_CONVERSATIONS", "DEMO_STORIES", "DEMO_VOCAB_SIZE", "Inputs", "Preempted", "StepLoop", "export_final",
           "publish_export", "resolve_inputs", "train", "write_resolved_config"]
