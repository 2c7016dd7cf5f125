"""Benchmarks of the trainer against the tutorial's method (issue 7): `python -m bench [--quick]`.

They print figures; they assert nothing about speed. BENCHMARKS.md records a full run.
"""
