"""The boundary's serving operations: dtype probing and torch numerics (TF32, deterministic, threads).

Forwards under changed numerics are checked against an independent Hugging Face forward
(``output_hidden_states``); the context manager must restore every setting, also on error.
"""

from __future__ import annotations

import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.model.forward import check_dtype, numerics


def _settings():
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())


def test_check_dtype_accepts_what_runs_and_names_what_does_not():
    assert check_dtype("cpu", "float32") is torch.float32
    assert check_dtype("cpu", torch.bfloat16) is torch.bfloat16
    with pytest.raises(TrajscopeError, match=r"^The cpu device cannot run float8_e4m3fn .*choose float32"):
        check_dtype("cpu", "float8_e4m3fn")
    for bad in ("banana", "int8"):
        with pytest.raises(TrajscopeError, match="Unknown dtype"):
            check_dtype("cpu", bad)


def test_numerics_sets_and_restores_even_on_error():
    before = _settings()
    with pytest.raises(RuntimeError, match="boom"):
        with numerics(tf32=not before[0], deterministic=True, threads=1) as got:
            assert got == {"tf32": not before[0], "deterministic": True, "threads": 1}
            assert _settings() == (not before[0], not before[0], True, 1)
            raise RuntimeError("boom")
    assert _settings() == before


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_forward_under_deterministic_one_thread_equals_hf(tiny_models, family):
    model = tiny_models[family]
    ids = model.encode("def f(x):\n    return x * 2")
    with model.numerics(deterministic=True, threads=1, tf32=False) as got:
        assert got["deterministic"] and got["threads"] == 1
        out = model.forward(ids, layers=[0])
    with torch.no_grad():
        ref = model.torch_module()(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    torch.testing.assert_close(out.resid[0], ref.hidden_states[1][0].float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits, ref.logits[0].float(), atol=1e-5, rtol=1e-4)
    assert not torch.are_deterministic_algorithms_enabled()
