"""Chat prompts: template rendering, the segment of every position, capture with messages, schema upgrade."""

from __future__ import annotations

import json

import polars as pl
import pytest

import trajscope as ts
from tiny import SAMPLE_DIR
from tiny_gguf import CHATML
from trajscope import positions
from trajscope.chat import encode_chat, turn_spans

# SmolLM2-135M-Instruct's template, verbatim: it writes a default system turn when none is given
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# a reasoning template (DeepSeek-R1 / Qwen3 style): the generation prompt opens a thought
REASONING_TEMPLATE = CHATML.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")


def tokenizer(template: str, specials: bool = True):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(SAMPLE_DIR)
    if specials:
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    return tok


def runs_text(tok, chat) -> list[tuple[str, str]]:
    return [(seg, tok.decode(chat.ids[a:b])) for seg, a, b in positions.segment_runs(chat.segments)]


def test_smollm2_template_default_system_turn():
    tok = tokenizer(SMOLLM2_TEMPLATE)
    chat = encode_chat(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert chat.ids == tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                               add_generation_prompt=True, return_dict=False)
    assert runs_text(tok, chat) == [
        ("system", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"),
        ("user", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"),
        ("assistant", "<|im_start|>assistant\n")]
    assert not chat.thinking_open


def test_turns_with_thinking_in_an_assistant_turn():
    tok = tokenizer(SMOLLM2_TEMPLATE)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>they greet</think>Hello!"}, {"role": "user", "content": "Bye"}]
    chat = encode_chat(tok, msgs)
    assert runs_text(tok, chat) == [
        ("system", "<|im_start|>system\nBe brief.<|im_end|>\n"), ("user", "<|im_start|>user\nHi<|im_end|>\n"),
        ("assistant", "<|im_start|>assistant\n"), ("thinking", "<think>they greet</think>"),
        ("assistant", "Hello!<|im_end|>\n"), ("user", "<|im_start|>user\nBye<|im_end|>\n"),
        ("assistant", "<|im_start|>assistant\n")]


def test_a_user_message_mentioning_think_tags_is_not_thinking():
    tok = tokenizer(CHATML)
    chat = encode_chat(tok, [{"role": "user", "content": "What does <think> mean?"}])
    assert set(chat.segments) == {"user", "assistant"}


def test_reasoning_template_opens_a_thought_that_generation_continues():
    tok = tokenizer(REASONING_TEMPLATE)
    chat = encode_chat(tok, [{"role": "user", "content": "2+2?"}])
    assert chat.thinking_open and runs_text(tok, chat)[-1] == ("thinking", "<think>\n")
    gen = ["Four", " is", " it", "</", "think", ">", "4"]
    assert positions.generated_segments(gen, chat.thinking_open) == ["thinking"] * 6 + ["assistant"]
    assert positions.generated_segments(gen, False) == ["assistant"] * 7


def test_think_tags_split_across_tokens_and_unclosed():
    texts = ["Sure", " <", "think", ">", "hm", "</think>", " ok", "<think>", "still"]
    assert positions.generated_segments(texts) == ["assistant", "thinking", "thinking", "thinking", "thinking",
                                                   "thinking", "assistant", "thinking", "thinking"]


def test_template_markup_spelled_as_bytes_still_splits_by_turn():
    tok = tokenizer(CHATML, specials=False)  # <|im_start|> is several ordinary tokens here
    chat = encode_chat(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    text = tok.decode(chat.ids)
    assert [s for s, _ in runs_text(tok, chat)] == ["system", "user", "assistant"]
    assert "".join(t for _, t in runs_text(tok, chat)) == text


def test_fallback_when_prefixes_render_differently():
    # a template that writes the number of messages first: no prefix of the conversation renders as a prefix
    tok = tokenizer("{{ messages | length }}" + CHATML)
    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": "Bye now"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    spans = turn_spans(tok, msgs, text)
    assert [s for _, _, s in spans] == ["user", "assistant", "user", "assistant"]
    assert text[spans[1][0]:].startswith("Hi") and text[spans[2][0]:].startswith("Bye now")
    assert spans[0][0] == 0 and spans[-1][1] == len(text)


@pytest.mark.parametrize("messages, fragment", [
    ([{"role": "robot", "content": "x"}], "Message 1 has role 'robot'"),
    ([{"role": "user", "content": 3}], "needs a \"content\" string"),
    ([{"role": "user", "content": "  "}], "every message's content is blank"),
])
def test_bad_messages(messages, fragment):
    with pytest.raises(ts.TrajscopeError, match=fragment):
        encode_chat(tokenizer(CHATML), messages)


def test_no_chat_template():
    with pytest.raises(ts.TrajscopeError, match="has no chat template"):
        encode_chat(tokenizer(None), [{"role": "user", "content": "hi"}])


# -- capture ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_model(tiny_dirs):
    model = ts.load_model(str(tiny_dirs["llama"]))  # its own tokenizer object: the template stays local
    model.tokenizer.chat_template = SMOLLM2_TEMPLATE
    return model


def test_capture_with_messages(chat_model, tmp_path):
    msgs = [{"role": "user", "content": "def f(x):"}]
    traj = ts.capture(chat_model, msgs, max_new_tokens=4, stop_at_eos=False)
    chat = encode_chat(chat_model.tokenizer, msgs)
    P = traj.prompt_len
    assert traj.token_ids[:P] == chat.ids and traj.tokens["segment"].to_list()[:P] == chat.segments
    assert traj.tokens["segment"].to_list()[P:] == ["assistant"] * 4
    assert traj.meta["messages"] == msgs and traj.meta["prompt"] == chat.text
    assert traj.meta["prompt_segments"] == positions.segment_runs(chat.segments)
    assert traj.tokens.columns.index("segment") == traj.tokens.columns.index("phase") + 1
    back = ts.Trajectory.load(traj.save(tmp_path / "run"))
    assert back.tokens.equals(traj.tokens)
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["messages"] == msgs


def test_plain_prompt_is_user_then_assistant(tiny_models):
    traj = ts.capture(tiny_models["llama"], "x = 1", max_new_tokens=3, stop_at_eos=False)
    by = traj.tokens.group_by("phase", "segment").len().sort("phase")
    assert by.select("phase", "segment").rows() == [("decode", "assistant"), ("prefill", "user")]
    assert traj.meta["prompt_segments"] == [["user", 0, traj.prompt_len]] and traj.meta["messages"] is None


def test_batched_capture_takes_messages(chat_model):
    from trajscope.capture.batch import capture_batch

    msgs = [[{"role": "user", "content": "a = 1"}], [{"role": "system", "content": "S"}, {"role": "user", "content": "b"}]]
    batched = capture_batch(chat_model, msgs, ts.CaptureConfig(max_new_tokens=3, stop_at_eos=False), batch_size=2)
    for m, traj in zip(msgs, batched):
        assert traj.tokens["token_id"].to_list()[:traj.prompt_len] == encode_chat(chat_model.tokenizer, m).ids
        assert traj.meta["messages"] == m and traj.tokens["segment"][0] == "system"


def test_version_2_runs_gain_the_segment_column(tiny_models, tmp_path):
    from trajscope.export import read_table
    from trajscope.trajectory import SCHEMA_VERSION

    traj = ts.capture(tiny_models["llama"], "x = 1", max_new_tokens=3, stop_at_eos=False)
    path = traj.save(tmp_path / "run")
    meta = json.loads((path / "meta.json").read_text())
    assert SCHEMA_VERSION == 3 and meta["schema_version"] == 3
    old = traj.tokens.drop("segment")
    old.write_parquet(path / "tokens.parquet", metadata={"trajscope_schema": "2", "trajscope_table": "tokens"})
    (path / "meta.json").write_text(json.dumps({**meta, "schema_version": 2}))
    back = ts.Trajectory.load(path)
    assert back.tokens.equals(traj.tokens) and back.meta["schema_version"] == 3
    assert read_table(path / "tokens.parquet").equals(traj.tokens)
    assert pl.read_parquet(path / "tokens.parquet").columns == old.columns  # the file itself is untouched


def test_any_table_groups_by_segment(chat_model):
    """Activations (keyed by pos) and telemetry (keyed by step) take their position's segment."""
    from trajscope.metrics.attention import step_telemetry

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):"}]
    traj = ts.capture(chat_model, msgs, max_new_tokens=4, stop_at_eos=False, residual_layers="all")
    P, tokens = traj.prompt_len, traj.tokens
    seg_of = dict(zip(tokens["pos"].to_list(), tokens["segment"].to_list()))
    acts = positions.with_segment(traj.activations, tokens)
    assert acts.height == traj.activations.height
    assert all(seg_of[p] == s for p, s in zip(acts["pos"].to_list(), acts["segment"].to_list()))
    by = acts.group_by("phase", "segment").len()
    assert set(by["segment"].to_list()) == {"system", "user", "assistant"}
    telemetry = step_telemetry(traj.attention, layer=0)  # keyed by step only
    tel = positions.with_segment(telemetry, tokens, P)
    steps, segs = tel["step"].to_list(), tel["segment"].to_list()
    assert segs[0] == seg_of[P - 1] == "assistant"  # step 0 reads the prompt up to the generation prompt
    assert all(s == seg_of[positions.query_pos(st, P)] for st, s in zip(steps, segs))
    lazy = positions.with_segment(telemetry.lazy(), tokens, P).collect()
    assert lazy.equals(tel)
    with pytest.raises(ValueError, match="prompt_len"):
        positions.with_segment(telemetry, tokens)


def test_study_prompt_files_take_chat_messages(chat_model, tmp_path):
    """A study's --prompts file may hold chat messages; they are rendered through the template."""
    from trajscope.errors import TrajscopeError
    from trajscope.studies import prompts as P

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "def f(x):"}]
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"id": "a", "messages": msgs}) + "\n" + json.dumps({"prompt": "x = 1"}) + "\n")
    items = P.read_prompt_file(f)
    encoded = dict(P.encode_prompts(chat_model, items))
    assert encoded["a"] == encode_chat(chat_model.tokenizer, msgs).ids
    assert encoded["2"] == chat_model.encode("x = 1")
    with pytest.raises(TrajscopeError, match="text prompts only"):
        P.with_header(items)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(TrajscopeError, match="line 1.*\"messages\" list"):
        P.read_prompt_file(tmp_path / "bad.jsonl")
