"""Settings and result of the app's Eviction card, as a ``param`` object (no Panel here).

:class:`EvictionSettings` holds the choice the card offers for the run on screen (one policy
of :data:`trajscope.metrics.eviction.POLICIES`, a budget as a fraction of the prompt, the
observation / recent window of the policies that have one), the study's
:class:`~trajscope.studies.registry.Result` of the last run, and the one-line summary read from it.
:meth:`EvictionSettings.check` turns a bad budget or window into one sentence before any model
work; :func:`run_study` runs the registered study's run function
(:func:`trajscope.studies.eviction.run`) on a trajectory's prompt (pure with respect to the app:
safe off the event loop). The card's run also asks for the per-step vs accumulated split
(``eviction_split`` tables) and, when the prompt hides a passkey (:func:`passkey_of`), the masked answer of
every needle policy at the card's budget (a ``needle_answers`` table in the same Result);
:func:`shipped_needle` reads the model's shipped needle table, if it has one.
"""

from __future__ import annotations

import math
import re

import param
import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.metrics.eviction import POLICIES
from trajscope.studies.registry import Result

NO_WINDOW = ("streamingllm",)  # sinks + recent tokens: no observation window
LABELS = {"snapkv": "SnapKV", "h2o": "H2O", "streamingllm": "StreamingLLM", "pyramidkv": "PyramidKV",
          "lookahead": "Lookahead (LAQ-style draft queries)", "pseudo": "Pseudo queries (DapQ-style)",
          "oracle": "Oracle (real decode queries)", "streamingllm_rolling": "StreamingLLM, rolling",
          "h2o_rolling": "H2O, rolling"}


def budget_error(budget) -> str | None:
    """One sentence when ``budget`` is not a fraction of the prompt in (0, 1], else None."""
    try:
        b = float(budget)
    except (TypeError, ValueError):
        b = math.nan
    if math.isnan(b) or not 0 < b <= 1:
        return f"Budget must be a fraction of the prompt in (0, 1], e.g. 0.2 keeps a fifth of it; got {budget}."
    return None


class EvictionSettings(param.Parameterized):
    """One eviction policy and budget for the run on screen, and what the study found."""

    policy = param.Selector(default="snapkv", objects=list(POLICIES),
                            doc="Eviction policy: which prompt keys stay in the cache after prefill.")
    budget = param.Number(default=0.5, doc="Kept prompt positions per head, as a fraction of the prompt in (0, 1].")
    window = param.Integer(default=4, doc="Observation / recent window w (prompt positions, at least 1; checked by "
                           ":meth:`check`); StreamingLLM has none.")
    busy = param.Boolean(default=False, doc="A study is running.")
    status = param.String(default="", doc="Progress / result line, or the one error sentence.")
    result = param.ClassSelector(class_=Result, allow_None=True,
                                 doc="The study's Result for this run's prompt (None before a run).")
    summary = param.String(default="", doc="One-line summary of the result.")

    def has_window(self) -> bool:
        """Whether the chosen policy reads the window."""
        return self.policy not in NO_WINDOW

    def check(self, prompt_len: int) -> str | None:
        """The one sentence that explains why these settings cannot run on a prompt of ``prompt_len`` tokens."""
        bad = budget_error(self.budget)
        if bad:
            return bad
        if self.has_window():
            if self.window is None or self.window < 1:
                return f"The window must be at least 1 prompt position; got {self.window}."
            if self.window > prompt_len:
                return (f"The window ({self.window}) is longer than this run's prompt ({prompt_len} tokens): "
                        f"use a window of 1–{prompt_len}.")
        return None

    def clear(self) -> None:
        """Forget the result (it belongs to the previous run)."""
        self.param.update(result=None, summary="", status="")


PASSKEY = re.compile(r"pass ?key is (\d{3,})", re.IGNORECASE)


def passkey_of(text: str) -> str | None:
    """The passkey a prompt hides ("… pass key is 1234567 …", as the needle study writes it), else None."""
    m = PASSKEY.search(text or "")
    return m.group(1) if m else None


def shipped_needle(model_id: str | None) -> pl.DataFrame | None:
    """The model's shipped needle accuracy table (``sample_data/<model>/report/needle/needle_summary.parquet``),
    or None when the model ships none or it is unreadable."""
    from trajscope.model import sample_data_dir

    if not model_id or not re.fullmatch(r"[\w.-]+", model_id):
        return None
    f = sample_data_dir() / model_id / "report" / "needle" / "needle_summary.parquet"
    try:
        return pl.read_parquet(f) if f.is_file() else None
    except Exception:  # a damaged file: the card shows no table rather than failing the tab
        return None


def passkey_answers(model, ids: list[int], key: str, budget: float, window: int) -> tuple[pl.DataFrame, list[str]]:
    """Each needle policy's greedy answer on this prompt at ``budget`` (and the full cache's), and the one sentence
    of each policy that cannot run on it (e.g. a budget within the window)."""
    from trajscope.studies.eviction import needle as nd

    item = {"id": "this run", "ids": list(ids), "key": key, "depth": float("nan"),
            "key_pos": nd.key_positions(model.tokenizer, ids, key)}
    from trajscope.metrics.eviction import SINKS, resolve_budget

    P, w = len(ids), min(window, len(ids))
    B = resolve_budget(budget, P)
    runs, notes = [], []
    for policy in nd.POLICIES:
        always = SINKS if policy.startswith("streamingllm") else w
        if B < P and B <= always:
            notes.append(f"{LABELS.get(policy, policy)}: a budget of {B} tokens is not larger than the {always} it "
                         "always keeps.")
        else:
            runs.append(policy)
    return nd.needle_study(model, [item], runs, [budget], window=w, answer_tokens=12), notes


def run_study(model, traj, policy: str, budget: float, window: int) -> Result:
    """The eviction study on ``traj``'s prompt tokens, for as many decode steps as ``traj`` generated, with the
    per-step vs accumulated split; on a passkey prompt also every needle policy's answer at ``budget``.

    The study captures its own greedy full run (every layer's attention) and the masked re-runs;
    for a greedy, unsteered ``traj`` of the same model its full run is ``traj`` again.

    Raises:
        TrajscopeError: a model other than the run's, or the study's own errors (one sentence).
    """
    from trajscope.studies.eviction.config import EvictionConfig
    from trajscope.studies.eviction.engine import run

    run_model = traj.meta.get("model", {}).get("model_id")
    if run_model is not None and run_model != model.model_id:
        raise TrajscopeError(f"This run was captured with '{run_model}' but the app's model is '{model.model_id}': "
                             "load that model to run the eviction study on it.")
    P = traj.prompt_len
    n_new = len(traj.token_ids) - P
    if n_new < 2:
        raise TrajscopeError("The eviction study needs a run with at least 2 generated tokens.")
    config = EvictionConfig(policies=(policy,), budgets=(float(budget),), max_new_tokens=n_new,
                            window=max(1, min(window, P)) if policy in NO_WINDOW else window,  # unread there
                            split=True)
    res = run(model, [(traj.run_id, list(traj.token_ids[:P]))], config)
    key = passkey_of(model.tokenizer.decode(list(traj.token_ids[:P])))
    if key is not None:
        answers, notes = passkey_answers(model, list(traj.token_ids[:P]), key, float(budget), window)
        res.tables["needle_answers"] = answers
        res.config["passkey"] = {"key": key, "notes": notes}
    return res
