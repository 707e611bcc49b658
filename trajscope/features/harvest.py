"""Harvest: one layer's residual activations over a prompt set, prefill and decode, tagged.

For every prompt, :func:`harvest` captures a greedy continuation and
``n_sampled`` sampled ones, either with :func:`trajscope.capture` (a
:class:`~trajscope.capture.CaptureConfig` with ``residual_layers=[layer]``, so the
vectors come from the same KV-cached engine users run) or, with
``engine="forward"``, with the model boundary's plain ``generate`` followed by
one no-cache forward (the same activations, many times faster). Rows:

- prefill rows: the prompt positions ``pos < P`` (step 0), once per prompt
  (they are identical in every continuation of that prompt), from position 1:
  position 0, the attention sink, is left out (:data:`trajscope.positions.SKIP_SINK`;
  ``meta`` records it with :func:`trajscope.positions.sink_meta`, and ``train-sae``
  copies that into the SAE's ``cfg.json``);
- decode rows: positions ``pos ≥ P`` of every continuation; ``step`` is the
  position's query step (:func:`trajscope.positions.query_step`).

Each row carries ``seq`` (index into :attr:`Harvest.sequences`), ``prompt_id``,
``source`` (``greedy`` / ``sample-i``), ``pos``, ``step``, ``phase``, ``token_id``,
``next_id`` (the token that followed; null past the end), ``entropy`` (next-token
entropy at the position, nats) and ``entropy_band`` / ``depth_band`` labels from
:mod:`trajscope.metrics.sae_eval`. A harvest saves to a directory
(``acts.safetensors`` + ``rows.parquet`` + ``sequences.parquet`` + ``meta.json``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Sequence

import polars as pl
import torch

from trajscope import positions
from trajscope.capture import CaptureConfig, capture
from trajscope.errors import TrajscopeError
from trajscope.metrics.sae_eval import depth_band, entropy_band
from trajscope.trajectory import write_table


@dataclasses.dataclass
class Harvest:
    """Activations ``acts [N, d_model]`` at ``layer`` with one tag row per activation.

    Attributes:
        acts: float32 ``[N, d_model]``.
        rows: Polars frame of N rows (columns in the module docstring).
        sequences: one row per captured sequence: ``seq``, ``prompt_id``, ``source``,
            ``prompt_len``, ``token_ids`` (prompt + generated, list of ints).
        layer: block index the activations were read at (block output).
        meta: settings (model, sampling, max_new_tokens, prompt file).
    """

    acts: torch.Tensor
    rows: pl.DataFrame
    sequences: pl.DataFrame
    layer: int
    meta: dict

    def __len__(self) -> int:
        return self.acts.shape[0]

    def subset(self, mask: Sequence[bool] | pl.Series | torch.Tensor) -> "Harvest":
        """Rows where ``mask`` is true (a boolean Series/list/tensor of length N)."""
        m = torch.as_tensor(pl.Series(mask).to_numpy() if not isinstance(mask, torch.Tensor) else mask, dtype=torch.bool)
        if m.shape[0] != len(self):
            raise TrajscopeError(f"The mask has {m.shape[0]} entries but the harvest has {len(self)} rows.")
        return Harvest(self.acts[m], self.rows.filter(pl.Series(m.numpy())), self.sequences, self.layer, dict(self.meta))

    def where(self, expr: pl.Expr) -> "Harvest":
        """Rows matching a Polars expression, e.g. ``h.where(pl.col("phase") == "prefill")``."""
        return self.subset(self.rows.select(expr.fill_null(False)).to_series())

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        from safetensors.torch import save_file

        p = pathlib.Path(path)
        p.mkdir(parents=True, exist_ok=True)
        save_file({"acts": self.acts.contiguous()}, str(p / "acts.safetensors"))
        write_table(self.rows, p / "rows.parquet", "harvest_rows")
        write_table(self.sequences, p / "sequences.parquet", "harvest_sequences")
        (p / "meta.json").write_text(json.dumps({**self.meta, "layer": self.layer}, indent=1), encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Harvest":
        from safetensors.torch import load_file

        p = pathlib.Path(path)
        files = ("acts.safetensors", "rows.parquet", "sequences.parquet", "meta.json")
        missing = [f for f in files if not (p / f).is_file()]
        if missing:
            raise TrajscopeError(f"'{p}' is not a harvest directory (missing {', '.join(missing)}); "
                                 "create one with `trajscope harvest`.")
        meta = json.loads((p / "meta.json").read_text(encoding="utf-8"))
        acts = load_file(str(p / "acts.safetensors"))["acts"]
        rows = pl.read_parquet(p / "rows.parquet")
        if rows.height != acts.shape[0]:
            raise TrajscopeError(f"'{p}' is corrupt: {rows.height} rows but {acts.shape[0]} activations.")
        return cls(acts, rows, pl.read_parquet(p / "sequences.parquet"), int(meta.pop("layer")), meta)


def _rows_of(traj: Any, seq: int, prompt_id: str, source: str, with_prefill: bool,
             skip_sink: bool = positions.SKIP_SINK) -> tuple[pl.DataFrame, torch.Tensor, list[int]]:
    """Tag rows and the residual rows kept from one trajectory."""
    tok = traj.tokens.sort("pos")
    ids = tok["token_id"].to_list()
    P = traj.prompt_len
    n = traj.residual(traj.meta["residual_layers"][0]).shape[0]
    pos = list(range(positions.first_reference_pos(skip_sink) if with_prefill else P, n))
    ent = tok["entropy"].to_list()
    df = pl.DataFrame({
        "seq": [seq] * len(pos), "prompt_id": [prompt_id] * len(pos), "source": [source] * len(pos),
        "pos": pos, "step": [positions.query_step(p, P) for p in pos],
        "phase": [positions.phase(p, P) for p in pos],
        "token_id": [ids[p] for p in pos], "next_id": [ids[p + 1] if p + 1 < len(ids) else None for p in pos],
        "entropy": [ent[p] for p in pos],
    }, schema_overrides={"next_id": pl.Int64, "entropy": pl.Float64})
    return df, torch.tensor(pos, dtype=torch.long), ids


class _ForwardRun:
    """The parts of a Trajectory that :func:`_rows_of` reads, from HF ``generate`` + one no-cache forward."""

    def __init__(self, meta: dict, tokens: pl.DataFrame, resid: torch.Tensor):
        self.meta, self.tokens, self._resid = meta, tokens, resid
        self.prompt_len = meta["prompt_len"]

    def residual(self, layer: int) -> torch.Tensor:
        return self._resid


def forward_run(model: Any, prompt: str, layer: int, *, max_new_tokens: int, temperature: float,
                top_p: float | None, seed: int, stop_at_eos: bool) -> _ForwardRun:
    """Generate with plain Hugging Face ``generate`` (KV cache), then read block ``layer``'s output and the
    next-token entropy at every computed position from one full-sequence forward without a cache
    (both through the model boundary: :meth:`~trajscope.model.ModelHandle.generate_ids` and
    :meth:`~trajscope.model.ModelHandle.forward`).

    The foundation's acceptance test pins ``capture``'s residuals to exactly this no-cache forward
    (1e-4 relative), and ``tests/sae/test_harvest_splice.py`` checks both engines give the same rows.
    """
    ids = model.encode(prompt)
    P = len(ids)
    out = model.generate_ids(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                             stop_at_eos=stop_at_eos)
    n = len(out) - 1  # positions that were a query of some step (the last token never was)
    fw = model.forward(out[:n], layers=[layer])
    lp = fw.logits.log_softmax(-1)
    ent = (-(lp.exp() * lp).sum(-1)).double().tolist()
    tokens = pl.DataFrame({"pos": list(range(len(out))), "token_id": out, "entropy": [*ent, None]},
                          schema_overrides={"entropy": pl.Float64})
    return _ForwardRun({"prompt_len": P, "residual_layers": [layer]}, tokens, fw.resid[layer])


def forward_runs(model: Any, jobs: Sequence[tuple[str, float, int]], layer: int, *, max_new_tokens: int,
                 top_p: float | None, stop_at_eos: bool, batch_size: int, padding_side: str) -> list[_ForwardRun]:
    """:func:`forward_run` for many ``(prompt, temperature, seed)`` jobs with the reading forwards batched.

    Greedy continuations are decoded ``batch_size`` at a time
    (:meth:`~trajscope.model.ModelHandle.greedy_batch`; alone when right padding would fall inside
    a sliding attention window); sampled ones are generated alone (so sampling seeds mean what they
    mean at batch 1). The no-cache forwards that read block ``layer``
    and the next-token entropies then run ``batch_size`` sequences at a time through
    :meth:`~trajscope.model.ModelHandle.forward_batch`, padded on ``padding_side`` (position ids count
    real tokens). Per sequence the result equals batch 1 within the determinism floor (tested).
    """
    encoded = [model.encode(prompt) for prompt, _, _ in jobs]
    window = model.sliding_window
    batched = padding_side == "left" or window is None or window >= max(map(len, encoded)) + max_new_tokens
    greedy = [j for j, (_, temp, _) in enumerate(jobs) if temp <= 0 and batched]
    outs: dict[int, list[int]] = {}
    for start in range(0, len(greedy), batch_size):
        group = greedy[start:start + batch_size]
        for j, out in zip(group, model.greedy_batch([encoded[j] for j in group], max_new_tokens=max_new_tokens,
                                                    padding_side=padding_side, stop_at_eos=stop_at_eos)):
            outs[j] = out
    seqs = []
    for j, (ids, (prompt, temp, seed)) in enumerate(zip(encoded, jobs)):
        out = outs[j] if j in outs else model.generate_ids(ids, max_new_tokens=max_new_tokens, temperature=temp,
                                                           top_p=top_p, seed=seed, stop_at_eos=stop_at_eos)
        seqs.append((len(ids), out))
    runs = []
    for start in range(0, len(seqs), batch_size):
        group = seqs[start:start + batch_size]
        results = model.forward_batch([out[:len(out) - 1] for _, out in group], padding_side=padding_side,
                                      layers=[layer])
        for (P, out), fw in zip(group, results):
            lp = fw.logits.log_softmax(-1)
            ent = (-(lp.exp() * lp).sum(-1)).double().tolist()
            tokens = pl.DataFrame({"pos": list(range(len(out))), "token_id": out, "entropy": [*ent, None]},
                                  schema_overrides={"entropy": pl.Float64})
            runs.append(_ForwardRun({"prompt_len": P, "residual_layers": [layer]}, tokens, fw.resid[layer]))
    return runs


def harvest(model: Any, prompts: Sequence[dict], layer: int, *, max_new_tokens: int = 256, n_sampled: int = 1,
            temperature: float = 0.8, top_p: float | None = 0.95, seed: int = 0, stop_at_eos: bool = False,
            greedy: bool = True, engine: str = "capture",
            on_capture: Callable[[int, int], None] | None = None, batch_size: int = 1,
            padding_side: str = "right", skip_sink: bool = positions.SKIP_SINK) -> Harvest:
    """Capture continuations of ``prompts`` and collect ``layer``'s block outputs.

    Args:
        model: a :class:`trajscope.model.ModelHandle`.
        prompts: dicts with ``prompt`` (text) and optional ``id``.
        layer: block index (negative counts from the end).
        max_new_tokens: decode steps per continuation (0 = prefill only).
        n_sampled: sampled continuations per prompt (seeds ``seed``, ``seed+1``, …).
        temperature, top_p: sampling settings for the sampled continuations.
        stop_at_eos: end a continuation at EOS (default off, so every continuation reaches
            the same depth; the tiny sample model emits EOS at file ends).
        greedy: also capture the greedy continuation.
        engine: ``"capture"`` (:func:`trajscope.capture`, the engine users run; records every
            table, slow on CPU) or ``"forward"`` (:func:`forward_run`: HF ``generate`` then one
            no-cache forward per sequence; the same activations, many times faster).
        on_capture: called with (done, total) after each capture (progress bars).
        batch_size: sequences per reading forward (``engine="forward"`` only; :func:`forward_runs`).
        padding_side: ``left`` or ``right`` padding of those batches.
        skip_sink: leave position 0 (the attention sink) out of the prefill rows (the default, as
            every reference statistic does: :mod:`trajscope.positions`).

    Returns:
        A :class:`Harvest`; ``acts`` is ``[N, d_model]`` float32.
    """
    if not prompts:
        raise TrajscopeError("The prompt set is empty.")
    if engine not in ("capture", "forward"):
        raise TrajscopeError(f"engine must be 'capture' or 'forward', not '{engine}'.")
    if batch_size < 1:
        raise TrajscopeError(f"The batch size must be at least 1, not {batch_size}.")
    if batch_size > 1 and engine != "forward":
        raise TrajscopeError("A batched harvest needs engine 'forward' (--engine forward); the capture engine "
                             "runs one sequence per generation trace.")
    if padding_side not in ("left", "right"):
        raise TrajscopeError(f"padding_side must be 'left' or 'right', not '{padding_side}'.")
    n_layers = model.n_layers
    if not -n_layers <= layer < n_layers:
        raise TrajscopeError(f"Layer {layer} is out of range; the model has layers 0..{n_layers - 1}.")
    layer = layer % n_layers
    plans: list[tuple[str, float, int]] = []
    if max_new_tokens <= 0:
        plans = [("prefill", 0.0, 0)]
    else:
        if greedy:
            plans.append(("greedy", 0.0, seed))
        plans += [(f"sample-{i}", temperature, seed + i) for i in range(n_sampled)]
    if not plans:
        raise TrajscopeError("Nothing to capture: greedy is off and n_sampled is 0.")
    frames, chunks, seqs = [], [], []
    total, done = len(prompts) * len(plans), 0
    batched = None
    if batch_size > 1:
        batched = iter(forward_runs(model, [(item["prompt"], temp, s) for item in prompts for _, temp, s in plans],
                                    layer, max_new_tokens=max(1, max_new_tokens), top_p=top_p,
                                    stop_at_eos=stop_at_eos, batch_size=batch_size, padding_side=padding_side))
    for i, item in enumerate(prompts):
        pid = str(item.get("id", i))
        for j, (source, temp, s) in enumerate(plans):
            if batched is not None:
                traj = next(batched)
            elif engine == "forward":
                traj = forward_run(model, item["prompt"], layer, max_new_tokens=max(1, max_new_tokens),
                                   temperature=temp, top_p=top_p, seed=s, stop_at_eos=stop_at_eos)
            else:
                cfg = CaptureConfig(max_new_tokens=max(1, max_new_tokens), temperature=temp, prefill_rows="all",
                                    top_p=top_p if temp > 0 else None, seed=s, stop_at_eos=stop_at_eos,
                                    residual_layers=[layer])
                traj = capture(model, item["prompt"], cfg, run_id=f"{pid}-{source}")
            seq = len(seqs)
            df, pos, ids = _rows_of(traj, seq, pid, source, with_prefill=(j == 0), skip_sink=skip_sink)
            if max_new_tokens <= 0:
                keep = df["phase"] == "prefill"
                df, pos = df.filter(keep), pos[torch.as_tensor(keep.to_numpy())]
            frames.append(df)
            chunks.append(traj.residual(layer)[pos].float())
            seqs.append({"seq": seq, "prompt_id": pid, "source": source, "prompt_len": traj.prompt_len,
                         "token_ids": ids})
            done += 1
            if on_capture is not None:
                on_capture(done, total)
    rows = pl.concat(frames).with_columns(
        pl.col("entropy").map_elements(entropy_band, return_dtype=pl.String).alias("entropy_band"),
        pl.col("step").map_elements(depth_band, return_dtype=pl.String).alias("depth_band"))
    desc = model.describe()
    meta = {"model": desc["model_id"], "revision": desc["revision"], "layer_name": f"block {layer} output",
            "max_new_tokens": max_new_tokens, "n_sampled": n_sampled, "temperature": temperature,
            "top_p": top_p, "seed": seed, "stop_at_eos": stop_at_eos, "greedy": greedy, "n_prompts": len(prompts), "engine": engine,
            "serving": {"batch_size": batch_size, "padding_side": padding_side, "dtype": model.dtype,
                        "device": model.device}, **positions.sink_meta(skip_sink)}
    return Harvest(torch.cat(chunks), rows, pl.DataFrame(seqs), layer, meta)
