"""The prefill step reduced layer by layer as the trace reads it (kernels.prefill_layer).

The reference is the same capture with the loop handing every layer's raw reads
to the step kernel at once (``layer_fn=None``, as before): every table, kept
tensor and SAE feature must be equal, on models whose prefill rows differ (GQA, a
sliding window shorter than the prompt), with steering applied at the prefill
(the reduced residual must be the steered one). And the loop must really let each
layer's ``[P, d]`` block output go once it is reduced: by the time the logits are
read, only the kept layers' residuals are alive.
"""

from __future__ import annotations

import weakref

import pytest
import torch

import trajscope as ts
from trajscope.capture import kernels
from trajscope.model.handle import ModelHandle
from trajscope.sae.model import SAE, SAEConfig
from test_capture_chunks import PROMPT, assert_same, window_model  # noqa: F401  (fixture)


def _raw_reads(monkeypatch) -> None:
    """Make captures hand the raw prefill reads to the step kernel (no reduction in the loop)."""
    real = ModelHandle.generation

    def generation(self, *args, **kw):
        return real(self, *args, **{**kw, "layer_fn": None})

    monkeypatch.setattr(ModelHandle, "generation", generation)


@pytest.mark.parametrize("name", ["gpt2", "llama", "window"])
def test_prefill_reduced_as_read_equals_the_raw_reads(tiny_models, window_model, monkeypatch, name):  # noqa: F811
    model = window_model if name == "window" else tiny_models[name]
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=64, k=4,
                        hook_name="blocks.1.hook_resid_post"), seed=5)
    vec = ts.SteeringVector(layer=1, direction=torch.randn(model.d_model) * 3, start_step=0)
    kw = dict(max_new_tokens=5, stop_at_eos=False, residual_layers=[0], attention_layers=[1], top_k_keys=4,
              sae=sae, sae_top_k=3, steering=[vec])
    reduced = ts.capture(model, PROMPT, **kw)
    _raw_reads(monkeypatch)
    raw = ts.capture(model, PROMPT, **kw)
    assert reduced.features.filter(reduced.features["step"] == 0).height > 0
    assert_same(reduced, raw)
    # the steering reached the reduced residual statistics: an unsteered run differs at layer 1's prefill
    plain = ts.capture(model, PROMPT, **{**kw, "steering": []})

    def prefill_norms(t: ts.Trajectory) -> list[float]:
        return t.activations.filter((t.activations["step"] == 0) & (t.activations["layer"] == 1))["norm"].to_list()

    assert prefill_norms(plain) != pytest.approx(prefill_norms(reduced), abs=1e-3)


def test_prefill_keeps_only_the_kept_layers_block_outputs(tiny_models, monkeypatch):
    model = tiny_models["gpt2"]
    alive_at_logits: list[int] = []
    refs: list[weakref.ref] = []
    real_generation = ModelHandle.generation

    def layer_fn(layer, P, a, r, opts):
        refs.append(weakref.ref(r))
        return kernels.prefill_layer(layer, P, a, r, opts)

    def generation(self, ids, gen_kwargs, step_fn, *args, **kw):
        def counting_step_fn(step, *a, **k):
            if step == 0:
                alive_at_logits.append(sum(ref() is not None for ref in refs))
            return step_fn(step, *a, **k)
        return real_generation(self, ids, gen_kwargs, counting_step_fn, *args, **{**kw, "layer_fn": layer_fn})

    monkeypatch.setattr(ModelHandle, "generation", generation)
    traj = ts.capture(model, PROMPT, max_new_tokens=3, stop_at_eos=False, residual_layers=[0])
    assert len(refs) == model.n_layers and alive_at_logits
    # the loop's own variable may still hold the last layer's read; every other unkept layer is gone
    assert alive_at_logits[0] <= 1, alive_at_logits
    assert traj.residual(0).shape[0] == traj.prompt_len + 2
