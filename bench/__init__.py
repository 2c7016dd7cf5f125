"""Benchmarks of the trainer against the method of Google's GKE JAX-on-TPU Gemma 3 tutorial: `python -m bench [--quick]`.

They print figures; they assert nothing about speed. BENCHMARKS.md records a full run.
"""
