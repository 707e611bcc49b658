"""CE loss recovered (trajscope.features.ce_recovered) against an independent computation with HF forward hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trajscope.errors import TrajscopeError
from trajscope.features.ce_recovered import ce_recovered, ce_recovered_interval, ratio_interval, splice_ce
from tests.sae.sae_helpers import tiny_sae

LAYER = 1


def hooked_ce(hf: torch.nn.Module, ids: list[int], replace, first_pos: int = 1, layer: int = LAYER) -> np.ndarray:
    """Per-position next-token CE with block ``layer``'s output at positions ≥ first_pos replaced (None: clean)."""
    def hook(_m, _i, out):
        h = out[0] if isinstance(out, tuple) else out
        h = h.clone()
        h[:, first_pos:] = replace(h[:, first_pos:])
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = hf.model.layers[layer].register_forward_hook(hook) if replace is not None else None
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].float()
    finally:
        if handle is not None:
            handle.remove()
    return F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none").numpy()[first_pos:]


@pytest.fixture(scope="module")
def setup(sample_model):
    sae = tiny_sae(d_in=sample_model.d_model, d_sae=4 * sample_model.d_model, k=8, seed=3)
    ids = sample_model.encode("def read_config(path):\n    \"\"\"Read the configuration file and return a dict.")
    return sample_model, sae, ids


def test_splice_ce_equals_hf_hooks(setup):
    model, sae, ids = setup
    got = splice_ce(model, {"sae": sae}, ids, LAYER)
    hf = model.torch_module()
    clean = hooked_ce(hf, ids, None)
    zero = hooked_ce(hf, ids, torch.zeros_like)
    spliced = hooked_ce(hf, ids, lambda x: sae(x.float()).to(x.dtype))
    np.testing.assert_allclose(got["clean"], clean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["zero"], zero, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["sae"], spliced, rtol=1e-4, atol=1e-4)
    expected = (zero.mean() - spliced.mean()) / (zero.mean() - clean.mean())
    assert ce_recovered(got["clean"], got["zero"], got["sae"]) == pytest.approx(expected, rel=1e-4)
    # splicing the sink position too is a different computation: the check can fail
    with_sink = hooked_ce(hf, ids, lambda x: sae(x.float()).to(x.dtype), first_pos=0)[1:]
    assert not np.allclose(got["sae"], with_sink, rtol=1e-4, atol=1e-4)


def test_ce_recovered_bounds_and_errors():
    assert ce_recovered([1.0], [5.0], [1.0]) == 1.0
    assert ce_recovered([1.0], [5.0], [5.0]) == 0.0
    with pytest.raises(TrajscopeError):
        ce_recovered([2.0], [1.0], [1.5])


def test_ratio_interval_resamples_clusters():
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(20), 10)
    num = rng.random(200) + (clusters % 2)
    den = np.ones(200) * 2
    iv = ratio_interval(num, den, clusters, n_boot=300)
    assert iv.estimate == pytest.approx(num.sum() / den.sum())
    assert iv.lo < iv.estimate < iv.hi and iv.n_clusters == 20
    c, z = np.full(200, 1.0), np.full(200, 3.0)
    s = c + rng.random(200)
    assert ce_recovered_interval(c, z, s, clusters, n_boot=200).estimate == pytest.approx(ce_recovered(c, z, s))
