"""The steering kernel: add to, or clamp, a hidden state position by position (torch only).

It runs inside the generation trace (locally, or on the NDIF server, where this
module is shipped by value with ``nnsight.register``) and inside plain forwards,
so it imports nothing but torch. A spec is the tuple that
:meth:`trajscope.steering.SteeringVector.spec` returns:
``(direction [d_model], strength, start_step, end_step or −1, mode)``.

- ``"add"``: ``h ← h + strength · direction``;
- ``"clamp"``: ``h ← h − (h·û)û + strength · û`` with ``û`` the unit direction.

A spec is active at the positions whose query step ``s`` satisfies
``start_step ≤ s < end_step`` (see :mod:`trajscope.positions`).
"""

from __future__ import annotations

import torch


def steer_hidden(h: torch.Tensor, specs, steps: torch.Tensor):
    """Apply steering specs to a hidden state.

    Args:
        h: ``[batch, q, d_model]``.
        specs: spec tuples for this block (see the module docstring).
        steps: ``[q]`` the query step of each position (0 = prefill).
    Returns:
        The steered ``[batch, q, d_model]`` tensor, or None when no spec is active at any position.
    """
    changed = False
    for direction, strength, start, end, mode in specs:
        on = (steps >= start) & ((steps < end) if end >= 0 else torch.ones_like(steps, dtype=torch.bool))
        if not bool(on.any()):
            continue
        changed = True
        m = on.to(device=h.device, dtype=h.dtype).unsqueeze(-1)
        d = direction.to(device=h.device, dtype=h.dtype)
        if mode == "add":
            h = h + m * (strength * d)
        else:
            u = d / d.norm()
            h = h + m * (strength - (h * u).sum(-1, keepdim=True)) * u
    return h if changed else None
