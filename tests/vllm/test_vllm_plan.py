"""trajscope.vllm without vLLM: request validation and the batch map, scoring and steering on synthetic batches.

These run in the default suite (they need torch only). The batched results are checked against
trajscope's own per-request functions applied to each request's rows separately
(:meth:`ReferenceProfile.score`, :func:`sae_features`), and steering against a hand-built expectation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.profile import ReferenceProfile
from trajscope.sae import SAE, SAEConfig
from trajscope.sae.model import sae_features
from trajscope.vllm.catalogue import Catalogue
from trajscope.vllm.monitor import Monitor
from trajscope.vllm.request import plan_request

D, L = 16, 4


@pytest.fixture
def catalogue(tmp_path):
    g = torch.Generator().manual_seed(0)
    sae = SAE(SAEConfig(architecture="topk", d_in=D, d_sae=64, k=6, hook_name="blocks.2.hook_resid_post"), seed=1)
    sae.save(str(tmp_path / "saes" / "s2"))
    prof = ReferenceProfile(mean=torch.randn(L, D, generator=g, dtype=torch.float64),
                            var=torch.rand(L, D, generator=g, dtype=torch.float64) + 0.5,
                            median_abs=torch.ones(L, dtype=torch.float64), stat_mean=torch.zeros(L, 5, dtype=torch.float64),
                            stat_std=torch.ones(L, 5, dtype=torch.float64), threshold=torch.full((L,), 1.5, dtype=torch.float64),
                            info={"model_id": "synthetic"})
    prof.save(tmp_path / "profiles" / "p.safetensors")
    other = ReferenceProfile(**{k: (v[:, :8] if k in ("mean", "var") else v) for k, v in vars(prof).items()})
    other.save(tmp_path / "profiles" / "narrow.safetensors")
    from trajscope.steering import SteeringVector

    (tmp_path / "vectors").mkdir()
    SteeringVector(layer=1, direction=torch.randn(D, generator=g), strength=2.0).save(tmp_path / "vectors" / "v.safetensors")
    return Catalogue.scan(str(tmp_path))


@pytest.mark.parametrize("args, sentence", [
    ({"trajscope_steer": [1.0, 2.0], "trajscope_steer_layer": 1}, "The steering vector has width 2"),
    ({"trajscope_steer": "v", "trajscope_start_step": 0}, "trajscope_start_step must be ≥ 1"),
    ({"trajscope_steer": "v", "trajscope_start_step": 9}, "trajscope_start_step 9 is beyond the request"),
    ({"trajscope_sae": "nope"}, "Unknown SAE 'nope'"),
    ({"trajscope_profile": "narrow"}, "This profile was built on"),
    ({"trajscope_sae": "s2", "trajscope_layer": 1}, "This SAE was trained on layer 2"),
    ({"trajscope_run_id": "../x"}, "trajscope_run_id must be"),
    ({"trajscope_strength": 2}, "trajscope_strength was given without trajscope_steer"),
    ({"trajscope_colour": 1}, "Unknown trajscope key 'trajscope_colour'"),
])
def test_bad_keys_get_one_sentence(catalogue, args, sentence):
    with pytest.raises(TrajscopeError, match="^" + sentence.replace("(", r"\(").replace(".", r"\.")):
        plan_request(args, catalogue, L, D, max_tokens=8)


def test_plan_defaults_and_stored_vector_settings(catalogue):
    assert plan_request({"temperature": 1}, catalogue, L, D) is None
    p = plan_request({"trajscope_sae": "s2", "trajscope_steer": "v", "trajscope_start_step": "3"}, catalogue, L, D, 8)
    assert (p.layer, p.steer_layer, p.strength, p.start_step) == (2, 1, 2.0, 3)
    assert plan_request({"trajscope": 1}, catalogue, L, D).layer == L // 2


def _batch(monitor, catalogue):
    """Three requests in one forward: A's 3-token prefill, B's decode at pos 6 (P=5, step 2), C's 4-token prefill."""
    plans = {"A": {"trajscope_profile": "p", "trajscope_sae": "s2", "trajscope_sae_top_k": 3},
             "B": {"trajscope_profile": "p", "trajscope_sae": "s2", "trajscope_steer": "v", "trajscope_start_step": 2},
             "C": {"trajscope_sae": "s2", "trajscope_steer": "v", "trajscope_start_step": 1}}
    for rid, P in (("A", 3), ("B", 5), ("C", 4)):
        monitor.track(rid, plan_request(plans[rid], catalogue, L, D, 8), list(range(P)), {})
    pos = torch.tensor([0, 1, 2, 6, 0, 1, 2, 3])
    return monitor.begin(["A", "X", "B", "C"], np.array([0, 3, 3, 4, 8]), pos, torch.arange(8))


def test_batch_map_steps_and_steering_rows(catalogue):
    m = Monitor(catalogue, L, D)
    view = _batch(m, catalogue)
    assert view.step.tolist() == [0, 0, 0, 2, 0, 0, 0, 0]
    assert [(t.req_id, a, b) for t, a, b in view.spans] == [("A", 0, 3), ("B", 3, 4), ("C", 4, 8)]
    assert [r for _, r in view.logit_rows] == [0, 2, 3]  # untracked X holds batch row 1
    h, res = torch.randn(8, D), torch.randn(8, D)
    out = m.on_layer(1, h, res)
    vec = catalogue.vector("v").direction * 2.0
    want = h.clone()
    want[3] += vec  # only B's decode step 2 >= start 2; C's prefill (step 0) < start 1
    torch.testing.assert_close(out, want)


def test_batched_scores_and_features_equal_per_request_calls(catalogue):
    m = Monitor(catalogue, L, D)
    _batch(m, catalogue)
    h, res = torch.randn(8, D), torch.randn(8, D)
    m.on_layer(2, h, res)
    x = h + res
    prof, sae = catalogue.profile("p"), catalogue.sae("s2")
    rows = {"A": slice(0, 3), "B": slice(3, 4), "C": slice(4, 8)}
    for rid, sl in rows.items():
        rec = m.tracked[rid].rows[-1]
        assert rec["pos"].tolist() == [0, 1, 2, 6, 0, 1, 2, 3][sl]
        ref = sae_features(sae, x[sl], m.tracked[rid].plan.sae_top_k)
        torch.testing.assert_close(rec["sae"]["value"], ref["value"])
        assert torch.equal(rec["sae"]["feature"][ref["value"] > 0], ref["feature"][ref["value"] > 0])
        torch.testing.assert_close(rec["sae"]["sq_err"], ref["sq_err"])
        if rid != "C":
            torch.testing.assert_close(rec["score"], prof.score(2, x[sl]), rtol=1e-6, atol=1e-6)
        else:
            assert "score" not in rec


class _Tok:
    """A stand-in tokenizer: token id i reads as ``<i>``."""

    def batch_decode(self, seqs):
        return [f"<{s[0]}>" for s in seqs]


def test_a_finished_request_is_a_run_directory_that_loads_and_goes_into_the_report(catalogue, tmp_path):
    import trajscope as ts
    from trajscope.vllm import runs

    m = Monitor(catalogue, L, D)
    plan = plan_request({"trajscope_run_id": "r1", "trajscope_profile": "p", "trajscope_sae": "s2",
                         "trajscope_residuals": 1, "trajscope_steer": "v", "trajscope_start_step": 2}, catalogue, L, D, 8)
    t = m.track("req-1", plan, [5, 6, 7], {"temperature": 0.0, "max_new_tokens": 3})
    ids = [5, 6, 7, 8, 9]  # prompt + 2 fed generated tokens; 10 is the last, never fed
    for positions_, qsl in (([0, 1, 2], [0, 3]), ([3], [0, 1]), ([4], [0, 1])):
        m.begin(["req-1"], np.array(qsl), torch.tensor(positions_), torch.tensor([ids[p] for p in positions_]))
        m.on_layer(1, torch.randn(len(positions_), D), torch.randn(len(positions_), D))
        m.on_layer(2, torch.randn(len(positions_), D), torch.randn(len(positions_), D))
        m.on_logits(torch.randn(1, 32))
        m.end()
    traj = runs.trajectory(t, [8, 9, 10], _Tok(), {"model_id": "synthetic", "family": "test", "dtype": "float32",
                                                    "device": "cpu", "n_layers": L, "n_heads": 2},
                           "max_new_tokens", m.threshold("p", 2), {"engine": "test"})
    path = runs.save(traj, tmp_path)
    back = ts.Trajectory.load(path)
    assert back.token_ids == [5, 6, 7, 8, 9, 10] and back.prompt_len == 3
    assert back.tokens["step"].to_list() == [0, 0, 0, 1, 2, 3]
    assert back.tokens["logprob"].is_null().to_list() == [True, True, True, False, False, False]
    assert back.probe["step"].to_list() == [1, 2] and back.residual(2).shape == (5, D)
    assert back.activations["pos"].to_list() == [0, 1, 2, 3, 4] and back.attention.height == 0
    assert back.meta["steering"][0]["start_step"] == 2 and back.meta["vllm"]["prefix_cached_tokens"] == 0
    html = ts.compare([back, back]).save(tmp_path / "report.html")
    assert "r1" in open(html).read()
