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
    """Only the kept layers' block outputs and attention rows outlive their layer's reduction: neither the
    loop nor the row sink (which lets go of each entry as it is taken) holds the others until the logits."""
    model = tiny_models["gpt2"]
    assert model.attn_impl == "rows"  # the rows come from the sink
    alive_at_logits: list[int] = []
    rows_alive: list[int] = []
    refs: list[weakref.ref] = []
    row_refs: list[weakref.ref] = []
    real_generation = ModelHandle.generation

    def layer_fn(layer, P, a, r, opts):
        refs.append(weakref.ref(r))
        row_refs.append(weakref.ref(a))
        return kernels.prefill_layer(layer, P, a, r, opts)

    def generation(self, ids, gen_kwargs, step_fn, *args, **kw):
        def counting_step_fn(step, *a, **k):
            if step == 0:
                alive_at_logits.append(sum(ref() is not None for ref in refs))
                rows_alive.append(sum(ref() is not None for ref in row_refs))
            return step_fn(step, *a, **k)
        return real_generation(self, ids, gen_kwargs, counting_step_fn, *args, **{**kw, "layer_fn": layer_fn})

    monkeypatch.setattr(ModelHandle, "generation", generation)
    traj = ts.capture(model, PROMPT, max_new_tokens=3, stop_at_eos=False, residual_layers=[0])
    assert len(refs) == model.n_layers and alive_at_logits
    # the loop's own variable may still hold the last layer's read; every other unkept layer is gone
    assert alive_at_logits[0] <= 1, alive_at_logits
    assert len(row_refs) == model.n_layers and rows_alive[0] <= 1, rows_alive
    assert traj.residual(0).shape[0] == traj.prompt_len + 2


def _planted(n: int, d: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """A ``[n, d]`` block output with a sink: massive values at position 0, ties and both median parities."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(n, d, generator=g).round(decimals=2)  # rounding plants ties around the median
    r[0, :3] = torch.tensor([25000.0, -3000.0, 150.0])
    return r.to(dtype)


@pytest.mark.parametrize("shape", [(7, 5), (8, 6), (301, 64), (2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pooled_median_abs_is_torch_median_and_the_stats_are_unchanged(shape, dtype):
    """The prefill's massive-rule reference (NumPy's selection on the CPU) is exactly the lower median that
    ``residual_stats(pooled=True)`` takes with ``torch.median``, checked against a full sort; the prefill
    statistics computed with it equal the ones computed without it bit for bit."""
    from trajscope.metrics.residual_stats import residual_stats

    r = _planted(*shape, seed=shape[0], dtype=dtype)
    flat = r.float().abs().reshape(-1)
    med = kernels.pooled_median_abs(r)
    assert med.dtype == torch.float32
    assert float(med) == float(flat.sort().values[(flat.numel() - 1) // 2]) == float(flat.median())
    assert torch.equal(residual_stats(r, median_abs=med, pooled=True), residual_stats(r, pooled=True))
    # the rule counts something here, so a wrong reference would show in the stats
    assert residual_stats(r, median_abs=med, pooled=True)[0, -1] > 0


def test_pooled_median_abs_without_massive_values_or_with_nan():
    from trajscope.metrics.residual_stats import residual_stats

    quiet = torch.randn(16, 8)
    assert kernels.pooled_median_abs(quiet) is None
    assert torch.equal(residual_stats(quiet, median_abs=kernels.pooled_median_abs(quiet), pooled=True),
                       residual_stats(quiet, pooled=True))
    bad = _planted(16, 8, seed=3)
    bad[2, 2] = float("nan")  # torch.median propagates NaN; the fast path must not hide it
    assert torch.isnan(kernels.pooled_median_abs(bad))
    assert torch.equal(residual_stats(bad, median_abs=kernels.pooled_median_abs(bad), pooled=True).nan_to_num(7.0),
                       residual_stats(bad, pooled=True).nan_to_num(7.0))
