"""Capture on a CUDA device equals an independent Hugging Face eager forward there (runs where a GPU is).

The CPU suite checks capture against HF eager on the CPU (tests/test_capture.py). Two bugs that only a GPU shows
were found on the lent H200: the prompt ids (host) indexed the logits (device) in a ``gather``, and an SAE on the
CPU encoded the device's residuals. Both made every CUDA capture fail. :func:`measure` is also what
``benchmarks/capture_overhead_gpu.py`` prints and stores for each family.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

import trajscope as ts
from tiny import FAMILIES, build_tiny_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPT = "def fibonacci(n):\n    "


def measure(tmp: pathlib.Path, family: str, dev: str = "cuda", prompt: str = PROMPT) -> dict:
    """One tiny family's capture on ``dev`` against HF eager and ``generate`` on ``dev``, and a run with steering
    from decode step 3 plus a TopK SAE on ``dev`` against the same run on the CPU (float32, TF32 off).

    Returns:
        ``greedy_equal_hf_generate``, ``residual_max_rel_l2``, ``attention_rows_max_abs``,
        ``steered_sae_tokens_equal_cpu``, ``sae_features_equal_cpu``, ``sae_activation_max_abs_diff_vs_cpu``.
    """
    from transformers import AutoModelForCausalLM

    from trajscope.sae.model import SAE, SAEConfig

    torch.backends.cuda.matmul.allow_tf32 = False
    path = build_tiny_model(tmp, family)
    model = ts.load_model(str(path), device=dev, dtype="float32")  # load_model defaults to bfloat16 on CUDA
    traj = ts.capture(model, prompt, max_new_tokens=10, stop_at_eos=False, residual_layers="all",
                      attention_layers="all")
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).to(dev).eval()
    ids = torch.tensor([model.encode(prompt)], device=dev)
    gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                       temperature=None, top_p=None, top_k=None, eos_token_id=[],
                       pad_token_id=model.tokenizer.pad_token_id)[0].tolist()
    full = ref(torch.tensor([traj.token_ids[:-1]], device=dev), output_attentions=True, output_hidden_states=True)
    norm = dict(ref.named_modules())[model.family.final_norm]
    resid, rows = 0.0, 0.0
    for layer in range(model.n_layers):
        got = traj.residual(layer).to(dev)
        got = norm(got) if layer == model.n_layers - 1 else got
        want = full.hidden_states[layer + 1][0]
        resid = max(resid, ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-12)).max().item())
        rows = max(rows, (traj.attention_rows(layer).to(dev) - full.attentions[layer][0].float()).abs().max().item())
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=8 * model.d_model, k=4,
                        hook_name=f"blocks.{model.n_layers - 1}.hook_resid_post"), seed=1)
    vec = ts.SteeringVector(layer=0, direction=torch.randn(model.d_model, generator=torch.Generator().manual_seed(1)),
                            strength=8.0, start_step=3)
    kw = dict(max_new_tokens=10, stop_at_eos=False, steering=(vec,), sae=sae)
    on_dev, on_cpu = ts.capture(model, prompt, **kw), ts.capture(ts.load_model(str(path), device="cpu"), prompt, **kw)
    a, b = (t.features.sort(["pos", "feature"]) for t in (on_dev, on_cpu))
    same_features = a.select("pos", "feature").equals(b.select("pos", "feature"))
    return {"greedy_equal_hf_generate": traj.token_ids == gen, "residual_max_rel_l2": resid,
            "attention_rows_max_abs": rows, "steered_sae_tokens_equal_cpu": on_dev.token_ids == on_cpu.token_ids,
            "sae_features_equal_cpu": same_features,
            "sae_activation_max_abs_diff_vs_cpu": float((a["value"] - b["value"]).abs().max()) if same_features
            else float("nan")}


def _check(m: dict) -> None:
    assert m["greedy_equal_hf_generate"] and m["steered_sae_tokens_equal_cpu"] and m["sae_features_equal_cpu"]
    assert m["residual_max_rel_l2"] < 1e-4 and m["attention_rows_max_abs"] < 1e-5
    assert m["sae_activation_max_abs_diff_vs_cpu"] < 1e-4


@needs_cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_capture_equals_hf_eager_and_the_cpu_run(tmp_path, family):
    _check(measure(tmp_path, family))


def test_the_same_checks_hold_on_the_cpu(tmp_path):
    """The measurement itself runs in every suite (on the CPU, where its "device" run is a second CPU run)."""
    _check(measure(tmp_path, "llama", dev="cpu"))
