"""``trajscope capture`` with chat prompts: ``messages`` lines in a prompt file, and ``--chat``."""

from __future__ import annotations

import json
import shutil

import pytest

import trajscope as ts
from test_chat import SMOLLM2_TEMPLATE
from trajscope.cli import main


@pytest.fixture(scope="module")
def chat_dir(tiny_dirs, tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "llama"
    shutil.copytree(tiny_dirs["llama"], path)
    (path / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    return path


def test_prompt_file_with_messages(chat_dir, tmp_path):
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "x = 1"}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": msgs, "id": "chat"}) + "\n" + json.dumps({"prompt": "y", "id": "plain"}) + "\n")
    out = tmp_path / "runs"
    assert main(["capture", "--model", str(chat_dir), "--prompts", str(prompts), "--max-new-tokens", "2",
                 "--no-eos", "--out", str(out), "--quiet"]) == 0
    chat, plain = ts.Trajectory.load(out / "chat"), ts.Trajectory.load(out / "plain")
    assert chat.meta["messages"] == msgs and chat.meta["prompt"].startswith("<|im_start|>system\nBe terse.")
    assert chat.tokens["segment"].unique(maintain_order=True).to_list() == ["system", "user", "assistant"]
    assert plain.meta["messages"] is None and plain.meta["prompt"] == "y"


def test_chat_flag_wraps_the_prompt(chat_dir, tmp_path):
    assert main(["capture", "--model", str(chat_dir), "--prompt", "x = 1", "--chat", "--max-new-tokens", "2",
                 "--no-eos", "--out", str(tmp_path), "--quiet"]) == 0
    (run,) = list(tmp_path.iterdir())
    traj = ts.Trajectory.load(run)
    assert traj.meta["messages"] == [{"role": "user", "content": "x = 1"}]
    assert traj.tokens["segment"][0] == "system"  # the template's default system turn


def test_messages_lines_elsewhere_and_bad_messages_are_one_sentence(chat_dir, tmp_path, capsys):
    from trajscope.prompts import read_prompts

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ts.TrajscopeError, match="line 1: chat \"messages\" are taken by `trajscope capture` only"):
        read_prompts(f)
    f.write_text(json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n")
    assert main(["capture", "--model", str(chat_dir), "--prompts", str(f), "--out", str(tmp_path / "o")]) != 0
    assert "line 1: Message 1 has role 'bot'" in capsys.readouterr().err
