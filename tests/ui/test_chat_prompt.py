"""Generate on a model with a chat template sends the prompt as a user message (the Chat box, on by
default); the run's tokens then carry segments. A model without a template continues the text."""

from __future__ import annotations

from trajscope.capture import CaptureConfig
from trajscope.ui.runner import GenerationJob


def _job(model, prompt, chat):
    out = {}
    job = GenerationJob("tiny", prompt, CaptureConfig(max_new_tokens=3), lambda fn: fn(), lambda events: None,
                        lambda traj: out.setdefault("traj", traj), lambda msg: out.setdefault("error", msg),
                        loader=lambda *a, **k: model, chat=chat)
    job.start().thread.join(120)  # on its own thread, as the app runs it (it sets that thread's OpenMP count)
    return out


def test_chat_wraps_the_prompt_when_the_model_has_a_template(tiny_models, monkeypatch):
    model = tiny_models["llama"]
    monkeypatch.setattr(model.tokenizer, "chat_template",
                        "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}", raising=False)
    out = _job(model, "hello there", chat=True)
    assert "error" not in out, out
    traj = out["traj"]
    assert traj.meta["messages"] == [{"role": "user", "content": "hello there"}]
    segs = traj.tokens["segment"].to_list()
    assert "user" in segs and segs[-1] == "assistant"
    plain = _job(model, "hello there", chat=False)["traj"]
    assert not plain.meta.get("messages") and plain.prompt_len < traj.prompt_len


def test_a_model_without_a_template_continues_the_text(tiny_models, monkeypatch):
    model = tiny_models["llama"]
    monkeypatch.setattr(model.tokenizer, "chat_template", None, raising=False)
    traj = _job(model, "hello there", chat=True)["traj"]
    assert not traj.meta.get("messages")
