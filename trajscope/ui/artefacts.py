"""What the cards ask about artefacts: which SAE, profile and steering setting fit a run's model, what to say
when none does, and the SAE classes the views load.

The fitting rules live in :mod:`trajscope.artefacts` (shared with the calibration report) and are re-exported
here: :func:`sae_misfit` / :func:`profile_misfit` say why an artefact does not fit the run's model
(``meta["model"]``: model id, layers, width), :func:`find_sae` / :func:`find_profile` / :func:`find_steering`
find a shipped one that does. When none fits, :func:`no_sae` / :func:`no_profile` name the commands that build
one. No Panel here.

Views never import the SAE package, the feature index or the model boundary
themselves (a layout test checks it): they take what they load from here —
:class:`SAE`, :class:`FeatureIndex` and :func:`density_table`, :class:`FeatureLabels`
and :func:`sample_data_dir`.
"""

from __future__ import annotations

from trajscope.artefacts import (  # noqa: F401  (re-exported: the cards' way in)
    ALIASES, _name, find_profile, find_sae, find_steering, model_facts, profile_misfit, sae_misfit, same_model,
)
from trajscope.features.index import FeatureIndex, density_table  # noqa: F401  (re-exported for the views)
from trajscope.features.labels import FeatureLabels  # noqa: F401  (re-exported for the views)
from trajscope.model import sample_data_dir  # noqa: F401  (re-exported for the views)
from trajscope.sae.model import SAE  # noqa: F401  (re-exported for the views)


def drift_layers(n_layers: int, most: int = 8) -> list[int]:
    """The layers a run keeps for the Drift card: all of a shallow model, else ``most`` spread from first to last.

    Residuals cost ``n × d_model`` numbers per layer (2.3 MB in float32 for 1,000 SmolLM2 tokens), so a
    30-layer model keeps 8 layers by default; more are a choice under "Keep residuals of layers".
    """
    if n_layers <= most:
        return list(range(n_layers))
    return sorted({round(i * (n_layers - 1) / (most - 1)) for i in range(most)})


def _model_arg(facts: dict) -> str:
    return str(facts.get("model_id") or "MODEL")


def no_sae(facts: dict, why: str = "") -> str:
    """The SAE card's message when no SAE fits: why, and the commands that build one for this model."""
    m, mid = _model_arg(facts), (facts.get("n_layers") or 2) // 2
    return (f"No SAE for this model ('{m}'). {why} Build one with `trajscope prepare --model {m} --out build/` "
            f"(a profile, SAEs and a steering vector), or with `trajscope harvest --model {m} --prompts "
            f"PROMPTS.jsonl --layer {mid} --out harvest/` then `trajscope train-sae --harvest harvest/ --out "
            f"saes/layer{mid}/`, and type its directory above.").replace("  ", " ")


def no_profile(facts: dict, why: str = "") -> str:
    """The Drift card's message when no profile fits: why, and the command that builds one for this model."""
    m = _model_arg(facts)
    return (f"No drift profile for this model ('{m}'). {why} Build one with `trajscope profile --model {m} "
            "--prompts PROMPTS.jsonl --out profile.safetensors`, type its path above, and Generate again (runs keep "
            "the residuals of the profile's layers).").replace("  ", " ")
