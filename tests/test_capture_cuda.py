"""Capture on a CUDA device equals an independent Hugging Face eager forward there (runs where a GPU is).

The CPU suite checks capture against HF eager on the CPU (tests/test_capture.py). Two bugs that only a GPU shows
were found on the lent H200 (benchmarks/capture_overhead_gpu.py): the prompt ids (host) indexed the logits (device)
in a ``gather``, and an SAE on the CPU encoded the device's residuals. Both made every CUDA capture fail.
"""

from __future__ import annotations

import pytest
import torch

import trajscope as ts
from tiny import FAMILIES, build_tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPT = "def fibonacci(n):\n    "


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_capture_equals_hf_eager_and_the_cpu_run(tmp_path, family):
    from transformers import AutoModelForCausalLM

    from trajscope.sae.model import SAE, SAEConfig

    torch.backends.cuda.matmul.allow_tf32 = False
    path = build_tiny_model(tmp_path, family)
    model = ts.load_model(str(path), device="cuda", dtype="float32")
    traj = ts.capture(model, PROMPT, max_new_tokens=10, stop_at_eos=False, residual_layers="all",
                      attention_layers="all")
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).cuda().eval()
    full = ref(torch.tensor([traj.token_ids[:-1]], device="cuda"), output_attentions=True, output_hidden_states=True)
    norm = dict(ref.named_modules())[model.family.final_norm]
    for layer in range(model.n_layers):
        got = traj.residual(layer).cuda()
        got = norm(got) if layer == model.n_layers - 1 else got
        want = full.hidden_states[layer + 1][0]
        assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item() < 1e-4
        torch.testing.assert_close(traj.attention_rows(layer).cuda(), full.attentions[layer][0], atol=1e-5, rtol=0)
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=8 * model.d_model, k=4,
                        hook_name=f"blocks.{model.n_layers - 1}.hook_resid_post"), seed=1)
    vec = ts.SteeringVector(layer=0, direction=torch.randn(model.d_model, generator=torch.Generator().manual_seed(1)),
                            strength=8.0, start_step=3)
    kw = dict(max_new_tokens=10, stop_at_eos=False, steering=(vec,), sae=sae)
    on_gpu, on_cpu = ts.capture(model, PROMPT, **kw), ts.capture(ts.load_model(str(path), device="cpu"), PROMPT, **kw)
    assert on_gpu.token_ids == on_cpu.token_ids
    a, b = (t.features.sort(["pos", "feature"]) for t in (on_gpu, on_cpu))
    assert a.select("pos", "feature").equals(b.select("pos", "feature"))
    assert (a["value"] - b["value"]).abs().max() < 1e-4
