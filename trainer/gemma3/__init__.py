"""The Gemma 3 transformer, owned here: its architectures (`config`), its flax modules (`model`) and the image
encoder of the vision-language models (`vision`).

The trainer image does not install the `gemma` package: gemma's model imports kauldron, which imports
TensorFlow (1.3 GB of the image) at module level, and the trainer runs none of it. Parameter names and
shapes are gemma 4.0.1's `gm.nn.Transformer` and `gm.nn.LoRA`, so the official checkpoints, earlier
runs' checkpoints and exports load unchanged; tests/trainer/test_gemma3.py holds the model
logit-equal to gemma's on CPU (the test environment keeps gemma for that).
"""
