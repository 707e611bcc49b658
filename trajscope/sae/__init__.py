"""The SAE object: a sparse autoencoder over one layer's residual stream (:mod:`.model`), its
config (:mod:`.config`) and SAELens' on-disk format (:mod:`.io`).

This package holds the object only and imports nothing above it. What is done *with* SAEs —
harvesting activations, training, evaluating reconstruction prefill vs decode, splicing into
the model, the feature index and labels — lives in :mod:`trajscope.features`.
"""

from trajscope.sae.model import SAE, SAEConfig, resid_hook_name, sae_features

__all__ = ["SAE", "SAEConfig", "resid_hook_name", "sae_features"]
