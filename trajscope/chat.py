"""Chat prompts: messages rendered through the tokenizer's chat template, and the segment of each position.

A chat prompt is a list of messages ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``
(``developer`` counts as system and ``tool`` as user: :data:`trajscope.positions.ROLE_SEGMENT`).
:func:`encode_chat` renders it exactly as Hugging Face does for generation —
``apply_chat_template(messages, add_generation_prompt=True)``, i.e. the template's text tokenised
without extra special tokens — and labels every prompt position with a segment
(:mod:`trajscope.positions`) from the rendered text's character offsets:

- each message owns its *turn*: the text that rendering the conversation up to and including it
  adds to the rendering before it (role markup such as ``<|im_start|>user\\n`` … ``<|im_end|>\\n``
  included), so ``turn i = [len(render(messages[:i])), len(render(messages[:i+1])))``;
- text the template adds before the first turn by itself (a default system prompt, as SmolLM2's
  template writes when the conversation has none, or a BOS marker) is ``system``. It is found as
  the part of ``render(messages[:1])`` that is not in the tail that follows a system message the
  caller would have given;
- the generation prompt (``<|im_start|>assistant\\n``) is ``assistant``;
- inside assistant turns and the generation prompt, thinking spans (``<think>`` … ``</think>``,
  :func:`trajscope.positions.thinking_spans`) are ``thinking``; a generation prompt that opens a
  thought (reasoning templates) makes the generated text start inside it;
- a token takes the segment of its first character, or ``thinking`` when it overlaps a thinking span.

When a template renders a prefix of the conversation differently from the start of the whole
(it then cannot be cut into turns that way), each message's turn starts where its content
starts instead, and the markup before a message's content belongs to the turn before it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from trajscope import positions
from trajscope.errors import TrajscopeError

_SENTINEL = "\x00trajscope-system\x00"


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat prompt.

    Attributes:
        messages: the messages, as given (validated copies).
        text: the rendered prompt text (with the generation prompt).
        ids: its token ids, ``[P]``.
        segments: the segment of each of the ``P`` positions.
        thinking_open: the prompt ends inside a thinking span (generation starts thinking).
    """

    messages: list[dict]
    text: str
    ids: list[int]
    segments: list[str]
    thinking_open: bool


def is_chat(prompt: Any) -> bool:
    """True for a list of message dicts (a chat prompt); False for text or token ids."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, dict) for m in prompt)


def user_message(text: str) -> list[dict]:
    """A one-message conversation: ``text`` as the user's turn (the CLI's ``--chat``)."""
    return [{"role": "user", "content": text}]


def check_messages(messages: Any) -> list[dict]:
    """Validated copies of chat messages; one sentence naming the first bad message otherwise."""
    if not is_chat(messages):
        raise TrajscopeError("A chat prompt is a non-empty list of {\"role\": ..., \"content\": ...} messages.")
    out = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in positions.ROLE_SEGMENT:
            raise TrajscopeError(f"Message {i + 1} has role {role!r}; use one of {', '.join(positions.ROLE_SEGMENT)}.")
        if not isinstance(content, str):
            raise TrajscopeError(f"Message {i + 1} ({role}) needs a \"content\" string.")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise TrajscopeError("The chat prompt is empty; every message's content is blank.")
    return out


def render(tokenizer: Any, messages: Sequence[dict], generation_prompt: bool = True) -> str:
    """The template's text for ``messages`` (``add_generation_prompt=generation_prompt``)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TrajscopeError("This model's tokenizer has no chat template, so chat messages cannot be rendered; "
                             "give the prompt as plain text.")
    try:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrajscopeError(f"The model's chat template refused these messages ({first}).") from exc


def _try_render(tokenizer: Any, messages: Sequence[dict], generation_prompt: bool = False) -> str | None:
    try:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt, tokenize=False)
    except Exception:  # a template may refuse a partial conversation or a system message
        return None


def _injected_prefix(tokenizer: Any, messages: list[dict]) -> int:
    """Length of the text the template writes before the first turn by itself (0 when none)."""
    if messages[0]["role"] == "system":
        return 0
    alone = _try_render(tokenizer, [{"role": "system", "content": _SENTINEL}])
    both = _try_render(tokenizer, [{"role": "system", "content": _SENTINEL}, messages[0]])
    first = _try_render(tokenizer, messages[:1])
    if alone is None or both is None or first is None or not both.startswith(alone):
        return 0
    tail = both[len(alone):]
    return len(first) - len(tail) if first.endswith(tail) else 0


def turn_spans(tokenizer: Any, messages: list[dict], text: str) -> list[tuple[int, int, str]]:
    """Character spans ``(start, end, segment)`` covering ``text`` (before thinking is marked)."""
    n = len(messages)
    ends = [_try_render(tokenizer, messages[:i + 1]) for i in range(n)]
    seg = [positions.ROLE_SEGMENT[m["role"]] for m in messages]
    if all(e is not None and text.startswith(e) for e in ends):
        cuts = [_injected_prefix(tokenizer, messages)] + [len(e) for e in ends]
    else:  # fallback: turns start at their content (the first at 0)
        starts, at = [], 0
        for m in messages:
            j = text.find(m["content"], at)
            starts.append(j if j >= 0 else at)
            at = starts[-1] + (len(m["content"]) if j >= 0 else 0)
        base = _try_render(tokenizer, messages)
        cuts = [0] + starts[1:] + [len(base) if base is not None and text.startswith(base) and len(base) >= at else at]
    spans = [(0, cuts[0], positions.SYSTEM)] if cuts[0] > 0 else []
    spans += [(cuts[i], cuts[i + 1], seg[i]) for i in range(n)]
    spans.append((cuts[n], len(text), positions.ASSISTANT))  # the generation prompt
    return [(a, b, s) for a, b, s in spans if b > a]


def _thinking_open_at_end(text: str) -> bool:
    spans = positions.thinking_spans(text)
    if not spans or spans[-1][1] != len(text):
        return False
    opened = text[spans[-1][0]:]
    return not any(close in opened for _, close in positions.THINK_TAGS)


def encode_chat(tokenizer: Any, messages: Any) -> ChatPrompt:
    """Render ``messages`` through the chat template, tokenise, and label each position's segment.

    Args:
        tokenizer: a Hugging Face fast tokenizer with a chat template.
        messages: ``[{"role": ..., "content": ...}, ...]``.
    Returns:
        A :class:`ChatPrompt`; its ``ids`` equal ``apply_chat_template(messages, add_generation_prompt=True)``.
    Raises:
        TrajscopeError: bad messages, no chat template, a template that refuses them, a slow tokenizer.
    """
    messages = check_messages(messages)
    text = render(tokenizer, messages)
    if not getattr(tokenizer, "is_fast", False):
        raise TrajscopeError("Chat segments need a fast tokenizer (character offsets); this model's is slow.")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    labels = [positions.SYSTEM] * len(text)
    open_at_end = False
    for a, b, seg in turn_spans(tokenizer, messages, text):
        labels[a:b] = [seg] * (b - a)
        if seg == positions.ASSISTANT:
            for ta, tb in positions.thinking_spans(text[a:b]):
                labels[a + ta:a + tb] = [positions.THINKING] * (tb - ta)
            open_at_end = b == len(text) and _thinking_open_at_end(text[a:b])
    segments, prev = [], labels[0] if labels else positions.PLAIN_PROMPT_SEGMENT
    for s, e in offsets:
        if e > s:
            prev = positions.THINKING if positions.THINKING in labels[s:e] else labels[s]
        segments.append(prev)  # a zero-width token keeps the segment before it
    return ChatPrompt(messages=messages, text=text, ids=ids, segments=segments, thinking_open=open_at_end)


def prompt_fields(prompt: Any, prompt_len: int) -> dict:
    """What ``meta.json`` records about a prompt: its text, messages, segment runs and open thought."""
    if isinstance(prompt, ChatPrompt):
        return {"prompt": prompt.text, "messages": prompt.messages,
                "prompt_segments": positions.segment_runs(prompt.segments), "thinking_open": prompt.thinking_open}
    return {"prompt": prompt if isinstance(prompt, str) else None, "messages": None,
            "prompt_segments": [[positions.PLAIN_PROMPT_SEGMENT, 0, prompt_len]], "thinking_open": False}


def encode_prompt(model: Any, prompt: Any) -> tuple[list[int], Any]:
    """``(ids, prompt for meta)``: a chat prompt becomes its :class:`ChatPrompt`; text and ids pass through.

    Args:
        model: a :class:`~trajscope.model.ModelHandle` (its tokenizer and ``encode``).
        prompt: text, token ids, or chat messages.
    """
    if is_chat(prompt):
        chat = encode_chat(model.tokenizer, prompt)
        return chat.ids, chat
    return model.encode(prompt), prompt
