"""trajscope: does decode still look like prefill? Step through generation and measure it.

The public API is this short list; everything else is an implementation detail.

- :func:`load_model` opens a model (the shipped sample, SmolLM2 as ``"smollm2"``, a ``.gguf``
  file, a local directory, a cached Hugging Face name, or an NDIF model) through nnsight; the :class:`ModelHandle` is the one
  boundary that runs it.
- :func:`capture` runs prefill + decode of a text or chat-message prompt and records every
  step as a :class:`Trajectory`;
  a frozen :class:`CaptureConfig` says what is recorded and how it samples.
- :func:`capture_batch` captures many prompts in padded batches, one Trajectory per prompt
  (greedy; per prompt equal to :func:`capture` within the float32 floor).
- :class:`Trajectory` holds the tables (Polars) and optional tensors, and saves to /
  loads from a run directory.
- :class:`StepEvent` is what the streaming callback of :func:`capture` receives.
- :class:`SteeringVector` steers one block's output from a chosen decode step;
  :func:`steering_sweep` measures its onset and accumulated effect by start depth.
- :func:`build_profile` fits a prefill :class:`ReferenceProfile`; a :class:`DriftProbe` scores
  decode steps against it while :func:`capture` runs.
- :func:`compare` builds a standalone HTML comparison report of runs (a :class:`Comparison`);
  :func:`steering_sweep` returns a :class:`SweepResult`; :func:`export` writes many
  runs as one Hive-partitioned, schema-versioned Parquet dataset.
- :func:`eviction` runs the KV-eviction study (policies' kept prompt keys, per-step recall and
  evicted mass, masked re-runs) and returns its study :class:`~trajscope.studies.registry.Result`.
- :class:`TrajscopeError` is raised for bad input, with a one-sentence explanation.
- :class:`TrajScope` is the interactive app (Panel): ``panel serve apps/trajscope.py`` or
  ``ts.TrajScope(model="sample")`` in a notebook.
"""

from trajscope.capture import CaptureConfig, StepEvent, capture
from trajscope.capture.batch import capture_batch
from trajscope.errors import TrajscopeError
from trajscope.export import export
from trajscope.model import ModelHandle, load_model
from trajscope.profile import DriftProbe, ReferenceProfile
from trajscope.profile_build import build_profile
from trajscope.report import Comparison, compare
from trajscope.sae.model import SAE
from trajscope.steering import SteeringVector
from trajscope.studies.eviction.engine import eviction
from trajscope.sweep import SweepResult, steering_sweep
from trajscope.trajectory import Trajectory

__version__ = "0.1.0"
__all__ = ["load_model", "ModelHandle", "capture", "capture_batch", "CaptureConfig", "StepEvent", "Trajectory", "TrajscopeError",
           "TrajScope", "SteeringVector", "steering_sweep", "SweepResult", "build_profile", "ReferenceProfile",
           "DriftProbe", "SAE", "compare", "Comparison", "export", "eviction"]


def __getattr__(name: str):
    """``TrajScope`` imports Panel, so it loads on first use: the CLI and scripts stay light."""
    if name == "TrajScope":
        from trajscope.ui.views.app import TrajScope

        return TrajScope
    raise AttributeError(f"module 'trajscope' has no attribute {name!r}")
