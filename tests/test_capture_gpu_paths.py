"""The capture kernels' GPU paths, checked on the CPU against the CPU's paths.

On a GPU a capture is bound by its host's kernel launches and host syncs, so there it reduces the
prefill's layers in groups (``chunks.PrefillGroups`` → ``kernels.prefill_layers``), takes a larger
chunk of decode steps (``chunks.budget``), and computes the massive-activation rule with no host sync
(``residual_stats._n_massive_dense``, ``kernels.pooled_median_abs`` off the CPU). Each must give the
CPU path's numbers: the grouped prefill the same bits as one layer at a time (in a whole capture, and
on blocks with planted massive values), the dense rule the same counts as the sparse one. "No host
sync" is checked on the ``meta`` device, where any read of a value (``bool``, ``nonzero``) raises.
"""

from __future__ import annotations

import functools

import pytest
import torch

import trajscope as ts
from trajscope.capture import chunks, kernels
from trajscope.metrics import residual_stats as rs
from trajscope.sae.model import SAE, SAEConfig
from test_capture_chunks import PROMPT, assert_same, capture_mod, window_model  # noqa: F401  (fixture)


@pytest.mark.parametrize("budget_bytes", [1, 1 << 30])  # a layer per group (the tiny models have 2), all in one
@pytest.mark.parametrize("name", ["gpt2", "llama", "window"])
def test_grouped_prefill_equals_one_layer_at_a_time(tiny_models, window_model, monkeypatch, name,  # noqa: F811
                                                    budget_bytes):
    model = window_model if name == "window" else tiny_models[name]
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=64, k=4,
                        hook_name="blocks.1.hook_resid_post"), seed=5)
    vec = ts.SteeringVector(layer=1, direction=torch.randn(model.d_model) * 3, start_step=0)
    kw = dict(max_new_tokens=4, stop_at_eos=False, residual_layers=[0], attention_layers=[1], top_k_keys=4,
              sae=sae, sae_top_k=3, steering=[vec])
    alone = ts.capture(model, PROMPT, **kw)
    calls = []
    real = kernels.prefill_layers

    def counted(layers, *args):
        calls.append(list(layers))
        return real(layers, *args)

    monkeypatch.setattr(kernels, "prefill_layers", counted)
    monkeypatch.setattr(capture_mod, "PrefillGroups",
                        functools.partial(chunks.PrefillGroups, budget_bytes=budget_bytes))
    grouped = ts.capture(model, PROMPT, **kw)
    assert [layer for group in calls for layer in group] == list(range(model.n_layers))
    assert len(calls) == (1 if budget_bytes > 1 else model.n_layers)
    assert_same(grouped, alone)
    for table in ("attention", "activations", "tokens"):  # the grouped prefill is the same bits, not only close
        a, b = getattr(grouped, table), getattr(alone, table)
        assert a.filter(a["step"] == 0).drop("run_id").equals(b.filter(b["step"] == 0).drop("run_id")), table


def _block(P: int, d: int, seed: int, massive: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(P, d, generator=g) * (1 + seed)
    if massive:  # a sink: one position with values past both bars, one past the absolute bar only
        r[0, :3] = torch.tensor([25000.0, -3000.0, 150.0])
        r[2, 5] = 120.0
    return r


def test_prefill_layers_equal_prefill_layer_with_massive_values():
    P, H, d, n = 40, 3, 16, 8
    g = torch.Generator().manual_seed(0)
    rows = [torch.softmax(torch.randn(H, n, P, generator=g) * 3, -1) for _ in range(4)]
    for a in rows:  # the last n prompt queries see keys up to their own position
        a.masked_fill_(torch.arange(P)[None, None, :] > torch.arange(P - n, P)[None, :, None], 0.0)
    resid = [_block(P, d, i, massive=i % 2 == 0) for i in range(4)]  # layers 1 and 3: no reference median
    opts = ([0, 3], [1], 5, 5, None, None)
    one = [kernels.prefill_layer(i, P, rows[i], resid[i], opts) for i in range(4)]
    group = kernels.prefill_layers(list(range(4)), P, rows, resid, opts)
    assert one[0]["act"][0, -1] > 0 and one[2]["act"][0, -1] > 0  # the rule counts something here
    for a, b in zip(one, group):
        assert a.keys() == b.keys()
        for key, v in a.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, b[key]), key
            else:
                assert v == b[key], key


@pytest.mark.parametrize("case", ["pooled", "per-vector", "scalar", "per-position"])
def test_dense_massive_count_equals_the_sparse_one(case):
    clean = torch.stack([_block(12, 32, i, massive=True) for i in range(3)])  # [3, 12, 32]
    clean[2, 6] = 400.0  # a vector whose own median passes 0.1: with its own reference it counts nothing
    with_nan = clean.clone()
    with_nan[1, 4, 7] = float("nan")  # pooled, the reference is NaN and nothing counts; else only that vector's
    median_abs, pooled = {"pooled": (None, True), "per-vector": (None, False),
                          "scalar": (torch.tensor(0.05), False),
                          "per-position": (torch.rand(3, 12) * 2, False)}[case]
    for x in (clean, with_nan):
        sparse = rs._n_massive(x, x.abs().amax(-1), median_abs, torch.float32, pooled)
        assert torch.equal(sparse, rs._n_massive_dense(x, median_abs, torch.float32, pooled))
        assert sparse.sum() > 0 or (x is with_nan and pooled)


def test_the_gpu_paths_read_no_value_on_the_host():
    """On ``meta`` tensors any host read raises: the prefill layer's statistics and the grouped prefill run."""
    P, H, d, n = 40, 3, 16, 8
    r = torch.empty(P, d, device="meta")
    assert kernels.pooled_median_abs(r).device.type == "meta"
    assert rs.residual_stats(r, pooled=True).shape == (P, 7)
    with pytest.raises(Exception):  # what the CPU paths do (their gates and the sparse rule's nonzero)
        bool(r.abs().amax() > rs.MASSIVE_ABS)
    out = kernels.prefill_layers([0, 1], P, [torch.empty(H, n, P, device="meta")] * 2, [r, r],
                                 ([0], [], 5, 5, None, None))
    assert out[1]["act"].shape == (P, 7) and out[0]["resid"].device.type == "meta"


def test_a_gpu_reduces_longer_chunks_within_its_budget():
    assert chunks.budget("cpu") == chunks.BUDGET_BYTES and chunks.budget("cuda") == chunks.GPU_BUDGET_BYTES
    on_gpu = chunks.chunk_size(30, 9, 4096, chunks.budget("cuda"))  # SmolLM2 at P = 4,096
    assert on_gpu == chunks.MAX_CHUNK > chunks.chunk_size(30, 9, 4096)
    at_8k = chunks.chunk_size(30, 9, 8192, chunks.budget("cuda"))
    assert 1 < at_8k and 4 * 30 * 9 * at_8k * (8192 + chunks.MAX_CHUNK) <= chunks.GPU_BUDGET_BYTES


def test_entropy_kernel_against_a_float64_reference():
    tiny = torch.finfo(torch.float32).tiny
    rows = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5 - 2 * tiny, tiny, tiny],
                         [0.7, 0.2, 0.1, 0.0]])
    for a in (rows, torch.softmax(torch.randn(64, 500) * 4, -1), torch.softmax(torch.randn(2, 3, 9, 4000), -1)):
        x = a.double()
        ref = -(x * torch.where(x > 0, x.log(), torch.zeros_like(x))).sum(-1)
        got = kernels._entropy(a)
        assert got.dtype == torch.float32 and got.shape == a.shape[:-1]
        torch.testing.assert_close(got.double(), ref, atol=2e-6, rtol=0)
        torch.testing.assert_close(got, torch.special.entr(a).sum(-1), atol=2e-6, rtol=0)
    assert kernels._entropy(rows)[0] == 0  # a one-hot row
    assert torch.isnan(kernels._entropy(torch.tensor([[0.5, float("nan")]])))[0]
