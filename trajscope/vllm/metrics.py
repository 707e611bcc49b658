"""Prometheus metrics of the trajscope plugin, served beside vLLM's own on ``/metrics``.

When a tracked request is written (:mod:`trajscope.vllm.runs`), the worker adds what its run
holds to these series (``prometheus_client``, which vLLM depends on):

=====================================================  ===========  =========================================
series                                                  type         value
=====================================================  ===========  =========================================
``trajscope_requests_total{layer}``                     counter      tracked requests written (counted after
                                                                     the run's other series are in)
``trajscope_drift_score{profile,layer}``                histogram    drift score of every decode step (the run's
                                                                     ``probe`` table)
``trajscope_drift_flagged_steps_total{profile,layer}``  counter      decode steps above the profile's threshold
``trajscope_sae_reconstruction_error{sae,layer}``       histogram    ``‖x − x̂‖² / ‖x‖²`` of every computed position
                                                                     (the run's ``tokens.sae_rel_err``)
``trajscope_sae_window_positions{sae,layer,window}``    gauge        decode positions in the ``baseline`` /
                                                                     ``current`` window (:mod:`trajscope.vllm.rates`)
``trajscope_sae_feature_rate{sae,layer,feature,window}``  gauge      firing rate, in both windows, of the baseline's
                                                                     8 most frequent features
``trajscope_sae_feature_rate_kl{sae,layer}``            gauge        ``KL(current ‖ baseline)`` of the firing mix
=====================================================  ===========  =========================================

**Which registry.** vLLM's ``/metrics`` serves prometheus_client's default registry, or, when
``PROMETHEUS_MULTIPROC_DIR`` is set, the files every process writes there
(:func:`vllm.v1.metrics.prometheus.get_prometheus_registry`). The plugin runs in the engine's
worker, a process apart from the API server under ``vllm serve``, so
:mod:`trajscope.vllm.serve` sets ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory) before vLLM
starts: both processes then write their series there and one scrape of ``/metrics`` returns
vLLM's and trajscope's together. With the engine in the caller's process (``vllm.LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the series are in the default registry. Gauges keep the
most recent value written by any process (``multiprocess_mode="mostrecent"``).
"""

from __future__ import annotations

import functools
from typing import Any

from trajscope.vllm.rates import RateWindows, request_counts

TOP_FEATURES = 8
DRIFT_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, float("inf"))
RECON_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, float("inf"))


@functools.lru_cache(maxsize=1)
def series() -> dict[str, Any]:
    """The process's trajscope series, registered once in prometheus_client's default registry."""
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "requests": Counter("trajscope_requests_total", "Tracked requests written as trajscope runs.", ["layer"]),
        "drift": Histogram("trajscope_drift_score", "Drift score of each decode step against the request's profile.",
                           ["profile", "layer"], buckets=DRIFT_BUCKETS),
        "flagged": Counter("trajscope_drift_flagged_steps_total", "Decode steps whose drift score is above the "
                           "profile's threshold.", ["profile", "layer"]),
        "recon": Histogram("trajscope_sae_reconstruction_error", "SAE relative squared reconstruction error "
                           "of each computed position.", ["sae", "layer"], buckets=RECON_BUCKETS),
        "positions": Gauge("trajscope_sae_window_positions", "Decode positions in the SAE's baseline and current "
                           "rate windows.", ["sae", "layer", "window"], multiprocess_mode="mostrecent"),
        "rate": Gauge("trajscope_sae_feature_rate", "Firing rate of the baseline window's most frequent features, "
                      "in each window.", ["sae", "layer", "feature", "window"], multiprocess_mode="mostrecent"),
        "kl": Gauge("trajscope_sae_feature_rate_kl", "KL(current window || baseline window) of the SAE's feature "
                    "firing mix, in nats.", ["sae", "layer"], multiprocess_mode="mostrecent"),
    }


class RunMetrics:
    """Adds each written run to the series; keeps the feature-rate windows of each (SAE, layer).

    Args:
        baseline_requests, window_requests: rate window sizes (default: the environment, else 16).
    """

    def __init__(self, baseline_requests: int | None = None, window_requests: int | None = None):
        self.sizes = (baseline_requests, window_requests)
        self.windows: dict[tuple[str, int], RateWindows] = {}
        self.s = series()

    def observe(self, traj: Any, n_features: int | None = None) -> None:
        """Add the run ``traj`` (a :class:`~trajscope.trajectory.Trajectory` from :func:`trajscope.vllm.runs.trajectory`).

        Args:
            n_features: the width of the run's SAE (needed when the run has one).
        """
        meta, s = traj.meta, self.s
        layer = str(meta["vllm"]["monitored_layer"])
        probe = traj.probe
        if meta.get("probe") and probe is not None:
            name = str(meta["probe"]["profile"])
            for v in probe["score"].to_numpy():
                s["drift"].labels(name, layer).observe(float(v))
            s["flagged"].labels(name, layer).inc(int(probe["flagged"].sum()))
        if meta.get("sae") and traj.features is not None:
            self._sae(traj, str(meta["sae"]["name"]), layer, int(n_features))
        # counted last: in one process (the default registry, its requests series collected first) a scrape that
        # sees N requests sees every series of those N (a scrape between the count and the SAE windows read a
        # current window of 0 positions in CI). Under `vllm serve` a scrape reads each process's file per metric
        # type in turn, in no set order, so there it can still see the count before a gauge written just before it
        s["requests"].labels(layer).inc()

    def _sae(self, traj: Any, name: str, layer: str, n_features: int) -> None:
        s = self.s
        for v in traj.tokens["sae_rel_err"].drop_nulls().to_numpy():
            s["recon"].labels(name, layer).observe(float(v))
        decode = traj.features.filter(traj.features["step"] >= 1)
        n_pos = int((traj.activations["step"] >= 1).sum())
        key = (name, int(layer))
        if key not in self.windows:
            self.windows[key] = RateWindows(n_features, *self.sizes)
        w = self.windows[key]
        w.add(request_counts(decode["feature"].to_numpy(), n_features), n_pos)
        base, cur = w.baseline, w.current
        s["positions"].labels(name, layer, "baseline").set(base.positions)
        s["positions"].labels(name, layer, "current").set(cur.positions)
        for f in w.top_baseline(TOP_FEATURES):
            s["rate"].labels(name, layer, str(f), "baseline").set(float(base.rates[f]))
            if cur.requests:  # an empty current window has no rates
                s["rate"].labels(name, layer, str(f), "current").set(float(cur.rates[f]))
        kl = w.kl()
        if kl is not None:
            s["kl"].labels(name, layer).set(kl)

