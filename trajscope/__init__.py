"""trajscope: does decode still look like prefill? Step through generation and measure it.

The public API is this short list and the :mod:`trajscope.studies` namespace; everything else is
reached through its module and may change.

- :func:`load_model` opens a model (the shipped sample, SmolLM2 as ``"smollm2"``, a ``.gguf``
  file, a local directory, a cached Hugging Face name, or an NDIF model) through nnsight.
- :func:`capture` runs prefill + decode of a text or chat-message prompt and records every
  step as a :class:`Trajectory`; a frozen :class:`CaptureConfig` says what is recorded and how it
  samples.
- :class:`Trajectory` holds the tables (Polars) and optional tensors, and saves to / loads from a
  run directory.
- :class:`SteeringVector` steers one block's output from a chosen decode step (pass it to
  :func:`capture`).
- :class:`SAE` is a sparse autoencoder in SAELens' format; :func:`capture` records its top features.
- :class:`ReferenceProfile` is a prefill profile (``ReferenceProfile.load``); a :class:`DriftProbe`
  scores decode steps against it while :func:`capture` runs.
- :func:`compare` builds a standalone HTML comparison report of runs; :func:`export` writes many
  runs as one Hive-partitioned, schema-versioned Parquet dataset.
- :class:`TrajScope` is the interactive app (Panel): ``panel serve apps/trajscope.py`` or
  ``ts.TrajScope(model="sample")`` in a notebook.
- :func:`calibrate` writes the decode-regime calibration report for a model and its SAEs, steering
  vectors and drift profile (``trajscope calibrate``): a verdict per artefact and regime, from the studies.
- :class:`TrajscopeError` is raised for bad input, with a one-sentence explanation.
- :mod:`trajscope.studies` runs the registered studies (SAE drift, the serving studies…):
  ``ts.studies.studies()`` lists them, ``ts.studies.get(name)`` returns one, whose
  ``run(model, prompts, config)`` returns a ``ts.studies.Result``.

Reached through their modules: ``trajscope.model.ModelHandle`` (what :func:`load_model`
returns), ``trajscope.capture.batch.capture_batch``, ``trajscope.capture.StepEvent`` (what a
streaming callback receives), ``trajscope.studies.drift.build.build_profile``,
``trajscope.studies.steering.sweep.steering_sweep``, ``trajscope.studies.eviction.engine.eviction`` and
``trajscope.reports.comparison.Comparison``.
"""

from trajscope import studies
from trajscope.calibration import calibrate
from trajscope.capture import CaptureConfig, capture
from trajscope.errors import TrajscopeError
from trajscope.export import export
from trajscope.model import load_model
from trajscope.profile import DriftProbe, ReferenceProfile
from trajscope.reports.comparison import compare
from trajscope.sae.model import SAE
from trajscope.steering import SteeringVector
from trajscope.trajectory import Trajectory

__version__ = "0.1.0"
__all__ = ["load_model", "capture", "CaptureConfig", "Trajectory", "SteeringVector", "SAE", "ReferenceProfile",
           "DriftProbe", "compare", "export", "calibrate", "TrajScope", "TrajscopeError", "studies"]


def __getattr__(name: str):
    """``TrajScope`` imports Panel, so it loads on first use: the CLI and scripts stay light."""
    if name == "TrajScope":
        from trajscope.ui.views.app import TrajScope

        return TrajScope
    raise AttributeError(f"module 'trajscope' has no attribute {name!r}")
