"""Metrics: pure functions over trajectories' tables and tensors (Polars in, Polars out).

No Panel and no nnsight imports here; the UI, the report and the CLI all call the
same functions, so a number on screen is the number in an export.
"""
