"""Fixtures of the vLLM tests: one in-process vLLM engine serving SmolLM2 with the trajscope plugin.

These tests run in the environment of ``bash scripts/install.sh --vllm`` (``.venv-vllm``) and only
when selected: ``.venv-vllm/bin/python -m pytest -m vllm tests/vllm``. The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the tests read what the worker wrote as soon as a request ends.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

from vllm_helpers import BATCH_TEXTS, LAYER, N_NEW, PROMPT, RATE_WINDOWS, ROOT, SMOLLM2, float32_floor


def _selected(config) -> bool:
    expr = config.option.markexpr or ""
    return "vllm" in expr and "not vllm" not in expr


def pytest_collection_modifyitems(config, items):
    here = pathlib.Path(__file__).parent
    for item in items:
        if pathlib.Path(str(item.fspath)).is_relative_to(here) and item.get_closest_marker("vllm"):
            if not _selected(config):
                item.add_marker(pytest.mark.skip(reason="vLLM test: run it with `.venv-vllm/bin/python -m pytest -m vllm`"))
            elif importlib.util.find_spec("vllm") is None:
                item.add_marker(pytest.mark.skip(reason="vllm is not installed here: bash scripts/install.sh --vllm"))


def artefacts(root: pathlib.Path) -> pathlib.Path:
    """A catalogue directory: SmolLM2's SAE, profile and French vector, plus the sample model's profile."""
    (root / "saes").mkdir(parents=True)
    (root / "profiles").mkdir()
    (root / "vectors").mkdir()
    (root / "saes" / "layer15-prefill-only").symlink_to(SMOLLM2 / "saes" / "layer15-prefill-only")
    (root / "saes" / "layer15-hybrid").symlink_to(SMOLLM2 / "saes" / "layer15-hybrid")  # the metrics test's alone
    (root / "profiles" / "smollm2.safetensors").symlink_to(SMOLLM2 / "profile.safetensors")
    (root / "profiles" / "trajscope-tiny.safetensors").symlink_to(ROOT / "sample_data" / "profiles" / "trajscope-tiny.safetensors")
    (root / "vectors" / "french.safetensors").symlink_to(SMOLLM2 / "vectors" / "french_caa_layer6.safetensors")
    return root


@pytest.fixture(scope="session")
def model_dir() -> pathlib.Path:
    from trajscope.model.gguf_cache import gguf_model_dir, smollm2_gguf_or_raise

    return gguf_model_dir(smollm2_gguf_or_raise(), progress=False)


@pytest.fixture(scope="session")
def engine(tmp_path_factory, model_dir):
    """``(llm, out_dir)``: vLLM on SmolLM2 (float32, eager, prefix caching, block size 32) with the plugin."""
    out = tmp_path_factory.mktemp("vllm-runs")
    cat = artefacts(tmp_path_factory.mktemp("artefacts") / "a")
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TRAJSCOPE_VLLM_OUT=str(out), TRAJSCOPE_VLLM_ARTEFACTS=str(cat),
                      TRAJSCOPE_VLLM_MODEL=str(model_dir))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.update(TRAJSCOPE_VLLM_BASELINE_REQUESTS=str(RATE_WINDOWS[0]), TRAJSCOPE_VLLM_WINDOW_REQUESTS=str(RATE_WINDOWS[1]))
    from vllm import LLM

    from trajscope.vllm.admission import TrajscopeAdmission

    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, enable_prefix_caching=True, block_size=32,
              max_model_len=1024, seed=0, logits_processors=[TrajscopeAdmission])
    yield llm, out
    del llm


@pytest.fixture(scope="session")
def hf_model(model_dir):
    """The same weights through trajscope's own capture path (nnsight on Hugging Face), float32."""
    import trajscope as ts

    return ts.load_model(str(model_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def refs(hf_model):
    """trajscope.capture's greedy runs (float32, Hugging Face) of the test prompts, residuals of the tested layer kept."""
    import trajscope as ts

    return {t: ts.capture(hf_model, hf_model.encode(t), max_new_tokens=N_NEW, residual_layers=[LAYER], stop_at_eos=False)
            for t in (PROMPT, *BATCH_TEXTS)}


@pytest.fixture(scope="session")
def floor(model_dir, refs) -> float:
    """The float32 floor at the tested layer over every reference sequence (:func:`vllm_helpers.float32_floor`)."""
    return float32_floor(model_dir, [r.token_ids[:-1] for r in refs.values()])
