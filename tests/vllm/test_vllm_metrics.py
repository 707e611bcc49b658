"""The plugin's Prometheus series on the in-process engine equal what the runs' Parquet files say.

Each value is recomputed from the Parquet files alone (:func:`vllm_helpers.expected_series`: polars,
numpy and SciPy's ``entropy``), not through trajscope: drift-score sum, count and flagged steps, the SAE
reconstruction-error sum and count, and the feature-rate windows with their KL. The series are read from
the registry vLLM's ``/metrics`` serves (:func:`vllm.v1.metrics.prometheus.get_prometheus_registry`).
"""

from __future__ import annotations

import json

import pytest

from vllm_helpers import RATE_WINDOWS, SMOLLM2, expected_series, generate

pytestmark = pytest.mark.vllm
TEXTS = ("The capital of France is", "Write a haiku about rain.", "def add(a, b):", "Once upon a time, a fox",
         "List three colours:")


def _value(reg, name: str, **labels) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def test_series_equal_the_runs_parquet_recomputed(engine, hf_model):
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    llm, out = engine
    reg = get_prometheus_registry()
    drift, sae = {"profile": "smollm2", "layer": "15"}, {"sae": "layer15-hybrid", "layer": "15"}
    before = {k: _value(reg, n, **lab) for k, n, lab in (
        ("drift_sum", "trajscope_drift_score_sum", drift), ("drift_count", "trajscope_drift_score_count", drift),
        ("flagged", "trajscope_drift_flagged_steps_total", drift), ("requests", "trajscope_requests_total", {"layer": "15"}))}
    ids = []
    for i, text in enumerate(TEXTS):  # one request at a time: the finish order is the windows' order
        generate(llm, [hf_model.encode(text)], 10, [{"trajscope_run_id": f"metrics{i}", "trajscope_profile": "smollm2",
                                                    "trajscope_sae": "layer15-hybrid", "trajscope_sae_top_k": 16}])
        ids.append(f"metrics{i}")
    from trajscope.vllm.plugin import flush

    assert flush(timeout=60)  # the writer thread saves each run, then counts it
    width = json.loads((SMOLLM2 / "saes" / "layer15-hybrid" / "cfg.json").read_text())["d_sae"]
    want = expected_series([out / i for i in ids], width, *RATE_WINDOWS)
    assert want["drift_count"] == 5 * 9 and want["recon_count"] > 5 * 9
    assert _value(reg, "trajscope_requests_total", layer="15") - before["requests"] == 5
    assert _value(reg, "trajscope_drift_score_count", **drift) - before["drift_count"] == want["drift_count"]
    assert _value(reg, "trajscope_drift_score_sum", **drift) - before["drift_sum"] == pytest.approx(want["drift_sum"], rel=1e-9)
    assert _value(reg, "trajscope_drift_flagged_steps_total", **drift) - before["flagged"] == want["flagged"]
    # the SAE is this test's alone: its series hold these five runs only
    assert _value(reg, "trajscope_sae_reconstruction_error_count", **sae) == want["recon_count"]
    assert _value(reg, "trajscope_sae_reconstruction_error_sum", **sae) == pytest.approx(want["recon_sum"], rel=1e-9)
    assert _value(reg, "trajscope_sae_window_positions", **sae, window="baseline") == want["baseline_positions"]
    assert _value(reg, "trajscope_sae_window_positions", **sae, window="current") == want["current_positions"]
    assert _value(reg, "trajscope_sae_feature_rate_kl", **sae) == pytest.approx(want["kl"], rel=1e-9)
    assert want["kl"] > 0
    top = sorted(range(width), key=lambda f: (-want["baseline_rates"][f], f))[:8]
    for f in top:
        for w in ("baseline", "current"):
            got = reg.get_sample_value("trajscope_sae_feature_rate", {**sae, "feature": str(f), "window": w})
            assert got == pytest.approx(want[f"{w}_rates"][f], abs=1e-12), (f, w)
