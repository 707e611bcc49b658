"""The public API: a short, pinned ``trajscope.__all__`` plus the ``trajscope.studies`` namespace.

Changing the list is a decision: edit ``PUBLIC`` here together with ``trajscope/__init__.py``,
its docstring, ``docs/reference.md`` and the CHANGELOG.
"""

from __future__ import annotations

import trajscope as ts

PUBLIC = ["load_model", "capture", "CaptureConfig", "Trajectory", "SteeringVector", "SAE", "ReferenceProfile",
          "DriftProbe", "compare", "export", "calibrate", "TrajScope", "TrajscopeError", "studies"]
# reached through their modules now (they were top-level names before the API was cut down)
MODULE_ONLY = {"ModelHandle": "trajscope.model", "capture_batch": "trajscope.capture.batch",
               "StepEvent": "trajscope.capture", "build_profile": "trajscope.studies.drift.build",
               "steering_sweep": "trajscope.studies.steering.sweep", "SweepResult": "trajscope.studies.steering.sweep", "Comparison": "trajscope.reports.comparison",
               "eviction": "trajscope.studies.eviction.engine"}


def test_all_is_pinned():
    assert ts.__all__ == PUBLIC


def test_every_public_name_resolves_and_is_documented():
    for name in ts.__all__:
        obj = getattr(ts, name)
        assert (obj.__doc__ or "").strip(), f"trajscope.{name} has no docstring"
        assert name in ts.__doc__, f"the package docstring does not mention {name}"


def test_the_rest_is_reached_through_its_module():
    import importlib

    for name, module in MODULE_ONLY.items():
        assert not hasattr(ts, name), f"trajscope.{name} is not public"
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def test_studies_namespace_runs_studies():
    assert {"studies", "get", "Result"} <= set(ts.studies.__all__)
    found = ts.studies.studies()
    assert "sae-drift" in found and ts.studies.get("sae-drift") is found["sae-drift"]
    assert ts.studies.Result is found["sae-drift"].run.__globals__["Result"]
