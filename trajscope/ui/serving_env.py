"""The served app's process environment: OpenMP threads that sleep instead of spinning.

The app captures on a worker thread (the event loop must stay free). With
torch's OpenMP build, a team of intra-op threads that *spin* between parallel
regions (libgomp's default) cost a capture on a worker thread about 20% on a
2-core machine: ``ts.capture`` of 64 tokens on the sample model took 0.82 s on a
worker thread against 0.65 s on the main thread (medians of 8 interleaved runs),
and 0.67 s on the worker thread with ``OMP_WAIT_POLICY=PASSIVE`` (also with
``GOMP_SPINCOUNT=0``). The served app therefore defaults to the passive policy.
It is read once, when torch loads OpenMP, so it is set before torch is imported;
a value the operator set is kept. The command line (captures on the main thread)
is left alone.

This file imports nothing from trajscope (whose package imports torch): the app
file and ``benchmarks/app_generate.py`` load it by path, before anything else.
"""

from __future__ import annotations

import os
from typing import MutableMapping

DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :data:`DEFAULTS` in ``env`` (default: ``os.environ``) where unset; returns what it set.

    Call it before ``import torch`` (OpenMP reads it once); later calls change nothing in that process.
    """
    env = os.environ if env is None else env
    added = {k: v for k, v in DEFAULTS.items() if k not in env}
    env.update(added)
    return added


__all__ = ["apply", "DEFAULTS"]
