"""Sparse autoencoders: the model (:mod:`.model`), SAELens' on-disk format (:mod:`.io`),
activation harvesting over prompt sets (:mod:`.harvest`), training (:mod:`.train`) and the
spliced forward pass that measures what an SAE costs the model (:mod:`.splice`)."""

from trajscope.sae.model import SAE, SAEConfig, resid_hook_name, sae_features

__all__ = ["SAE", "SAEConfig", "resid_hook_name", "sae_features"]
