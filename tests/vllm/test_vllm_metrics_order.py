"""A scrape that sees a request counted sees all of that request's series (runs in the default suite).

CI caught ``/metrics`` between the request counter and the SAE windows: the test waited for the counter,
then read a current window of 0 positions. The counter is now the last series a run updates.
"""

from __future__ import annotations

import trajscope as ts
from trajscope.profile import profile_from_residuals
from trajscope.sae.model import SAE, SAEConfig
from trajscope.vllm.metrics import RunMetrics


class _Recorder:
    """Stands in for a prometheus_client metric: records (series, operation) in order."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def labels(self, *_):
        return self

    def __getattr__(self, op):
        return lambda *_: self.log.append((self.name, op))


def test_the_request_is_counted_after_its_drift_and_sae_series(tiny_models):
    model = tiny_models["llama"]
    res = [ts.capture(model, p, max_new_tokens=1, residual_layers="all") for p in ("x = 1\n", "import os\n", "y = 2\n")]
    prof = profile_from_residuals([{layer: t.residual(layer) for layer in range(model.n_layers)} for t in res], fpr=0.2)
    sae = SAE(SAEConfig(architecture="topk", d_in=model.d_model, d_sae=128, k=8, hook_name="blocks.1.hook_resid_post"),
              seed=3)
    traj = ts.capture(model, "def f(x):\n", max_new_tokens=6, stop_at_eos=False, sae=sae, sae_top_k=5,
                      probe=ts.DriftProbe(prof, every=1))
    traj.meta.update(vllm={"monitored_layer": 1}, probe={"profile": "p"}, sae={**traj.meta["sae"], "name": "s"})
    log: list = []
    metrics = RunMetrics.__new__(RunMetrics)  # without prometheus_client, which the test environment lacks
    metrics.sizes, metrics.windows = (1, 1), {}
    metrics.s = {k: _Recorder(k, log) for k in ("requests", "drift", "flagged", "recon", "positions", "rate", "kl")}
    metrics.observe(traj, 128)
    names = [name for name, _ in log]
    assert {"drift", "flagged", "recon", "positions"} <= set(names)
    assert names[-1] == "requests" and names.count("requests") == 1
