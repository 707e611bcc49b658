"""The documented command serves SmolLM2 through vLLM's OpenAI-compatible server with the plugin.

``python -m trajscope.vllm.serve smollm2 -- --port N`` is started as a subprocess; bad trajscope keys get
HTTP 400 with one sentence and the server keeps serving; a request steered from step k returns steered text
whose first k tokens are the unsteered ones; its run directory opens with ``Trajectory.load`` and goes into
the comparison report; ``/metrics`` lists the plugin's ``trajscope_*`` series beside vLLM's own, with the
values the served runs' Parquet files give.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from vllm_helpers import ROOT, SMOLLM2, expected_series

pytestmark = pytest.mark.vllm
PROMPT = "The capital of France is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("served-runs")
    port = _free_port()
    env = dict(os.environ, TRAJSCOPE_VLLM_OUT=str(out), VLLM_CPU_KVCACHE_SPACE="1", TRAJSCOPE_VLLM_BASELINE_REQUESTS="1",
               TRAJSCOPE_VLLM_WINDOW_REQUESTS="1",
               TRAJSCOPE_VLLM_ARTEFACTS=os.pathsep.join([str(SMOLLM2), str(ROOT / "sample_data")]))
    log = open(out / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "trajscope.vllm.serve", "smollm2", "--", "--port", str(port),
                             "--host", "127.0.0.1"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.time() + 400
        while time.time() < deadline:
            assert proc.poll() is None, (out / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(3)
        else:
            pytest.fail("vllm serve did not become healthy in 400 s")
        yield port, out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _completion(port, xargs: dict, n: int = 12) -> tuple[int, dict]:
    return _post(port, {"model": "smollm2", "prompt": PROMPT, "max_tokens": n, "temperature": 0,
                        "vllm_xargs": xargs})


@pytest.mark.parametrize("xargs, sentence", [
    ({"trajscope_steer": [1.0, 2.0, 3.0], "trajscope_steer_layer": 6}, "The steering vector has width 3 but the model's residual stream has width 576."),
    ({"trajscope_steer": "quotes_caa_layer3"}, "The steering vector has width "),  # the sample model's vector
    ({"trajscope_steer": "french_caa_layer6", "trajscope_start_step": 0}, "trajscope_start_step must be ≥ 1"),
    ({"trajscope_sae": "no-such-sae"}, "Unknown SAE 'no-such-sae'"),
    ({"trajscope_profile": "trajscope-tiny"}, "This profile was built on "),  # the sample model's profile
])
def test_bad_input_gets_one_sentence_and_the_server_keeps_serving(server, xargs, sentence):
    port, _ = server
    status, body = _completion(port, xargs)
    assert status == 400
    msg = body["error"]["message"]
    assert msg.startswith(sentence) and msg.count(". ") == 0, msg
    status, body = _completion(port, {}, n=4)
    assert status == 200 and body["choices"][0]["text"]


def test_steering_from_step_k_returns_steered_text_and_a_run_the_report_reads(server, tmp_path):
    import trajscope as ts

    port, out = server
    k = 3
    status, plain = _completion(port, {"trajscope_run_id": "served-plain"})
    assert status == 200
    status, steered = _completion(port, {"trajscope_run_id": "served-french", "trajscope_steer": "french_caa_layer6",
                                         "trajscope_start_step": k, "trajscope_sae": "layer15-prefill-only",
                                         "trajscope_profile": "smollm2"})
    assert status == 200
    a, b = plain["choices"][0]["text"], steered["choices"][0]["text"]
    assert a != b
    for r in ("served-plain", "served-french"):  # the server's writer thread saves a run just after its response
        deadline = time.monotonic() + 30
        while not (out / r / "meta.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    runs = [ts.Trajectory.load(out / r) for r in ("served-plain", "served-french")]
    P = runs[0].prompt_len
    assert runs[1].token_ids[:P + k] == runs[0].token_ids[:P + k]
    assert runs[1].token_ids[P + k:] != runs[0].token_ids[P + k:]
    assert "".join(runs[1].tokens["text"].to_list()[P:]) == b
    assert runs[1].features is not None and runs[1].probe is not None and runs[1].meta["steering"][0]["start_step"] == k
    html = pathlib.Path(ts.compare(runs).save(tmp_path / "report.html")).read_text()
    assert "served-french" in html


def test_metrics_endpoint_lists_trajscope_series_beside_vllms_with_the_runs_values(server):
    from prometheus_client.parser import text_string_to_metric_families

    port, out = server
    ids = []
    for i, prompt in enumerate(("The capital of France is", "Write a haiku about rain.")):
        status, _ = _post(port, {"model": "smollm2", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                 "vllm_xargs": {"trajscope_run_id": f"served-metrics{i}", "trajscope_profile": "smollm2",
                                                "trajscope_sae": "layer15-hybrid"}})
        assert status == 200
        ids.append(f"served-metrics{i}")
    # The server's writer thread saves a run just after its response, then adds it to the series, counting it last.
    # A scrape reads each process's file of each metric type in turn (prometheus_client's multiprocess collector),
    # so one scrape can see the count of a run and not yet a gauge written just before it: the series are read once
    # two scrapes in a row agree and count every saved run.
    deadline = time.monotonic() + 30
    previous = None
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            text = r.read().decode()
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(text) for s in fam.samples}
        ours = {k: v for k, v in samples.items() if k[0].startswith("trajscope_")}
        saved = [d for d in out.iterdir() if (d / "meta.json").is_file()]
        counted = samples.get(("trajscope_requests_total", (("layer", "15"),)))
        complete = all((out / i / "meta.json").is_file() for i in ids) and counted == len(saved)
        if (complete and ours == previous) or time.monotonic() > deadline:
            break
        previous = ours if complete else None
        time.sleep(0.2)
    names = {n for n, _ in samples}
    assert any(n.startswith("vllm:") for n in names)  # vLLM's own series, in the same scrape

    def val(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    # every run this server wrote (the other tests' included) goes into the drift series
    runs = sorted(d for d in out.iterdir() if (d / "meta.json").is_file())
    drift = expected_series(runs, 4608, 1, 1)
    lab = {"profile": "smollm2", "layer": "15"}
    assert val("trajscope_drift_score_count", **lab) == drift["drift_count"] > 0
    assert val("trajscope_drift_score_sum", **lab) == pytest.approx(drift["drift_sum"], rel=1e-9)
    assert val("trajscope_drift_flagged_steps_total", **lab) == drift["flagged"]
    assert val("trajscope_requests_total", layer="15") == len(runs)
    # layer15-hybrid is this test's alone: baseline window = its first request, current window = its second
    want = expected_series([out / i for i in ids], 4608, 1, 1)
    sae = {"sae": "layer15-hybrid", "layer": "15"}
    assert val("trajscope_sae_reconstruction_error_count", **sae) == want["recon_count"]
    assert val("trajscope_sae_reconstruction_error_sum", **sae) == pytest.approx(want["recon_sum"], rel=1e-9)
    assert val("trajscope_sae_window_positions", **sae, window="current") == want["current_positions"] == 7
    assert val("trajscope_sae_feature_rate_kl", **sae) == pytest.approx(want["kl"], rel=1e-9)
