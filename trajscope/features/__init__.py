"""SAE features at work: harvest activations, train SAEs, evaluate them prefill vs decode and index
their features.

The SAE object itself (encode/decode, config, SAELens' format) is :mod:`trajscope.sae`; this
package is what trajscope does with one:

- :mod:`.harvest`: one layer's residual activations over a prompt set, prefill and decode rows
  tagged with phase, step, depth and entropy bands;
- :mod:`.train`: prefill-only or hybrid prefill + decode SAE training on harvests;
- :mod:`.splice`: the spliced forward (the SAE's reconstruction in place of the layer's output)
  and its per-position KL / CE increase; :mod:`.ce_recovered`: CE loss recovered against
  zero-ablation;
- :mod:`.reconstruction`: reconstruction and feature overlap of several training mixes on one
  harvest (the tables of the ``sae-drift`` study, :mod:`trajscope.studies.sae_drift`);
- :mod:`.index`: each feature's top-activating contexts and prefill/decode density;
  :mod:`.labels`: the names a user gives features, kept beside the SAE.

Modules are imported by their full path (nothing is re-exported here), so importing one does
not import the others.
"""
