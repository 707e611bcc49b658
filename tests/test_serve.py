"""``trajscope serve``: this machine only unless told otherwise, and the operator's options reach the app."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from trajscope.cli import build_parser
from trajscope.cli.capture import serve_command
from trajscope.ui.operator import ServeConfig


def command(*argv: str) -> list[str]:
    return serve_command(build_parser().parse_args(["serve", *argv]))


def test_serve_binds_localhost_by_default():
    cmd = command()
    assert cmd[cmd.index("--address") + 1] == "127.0.0.1"
    assert "0.0.0.0" not in cmd and "--args" not in cmd and "--allow-websocket-origin" not in cmd


def test_serve_passes_the_operator_options_to_the_app(tmp_path):
    cmd = command("--address", "0.0.0.0", "--allow-websocket-origin", "team.example:5006", "--prefix", "/ts",
                  "--data-dir", str(tmp_path / "a"), "--data-dir", str(tmp_path / "b"), "--models", "sample,gpt2",
                  "--max-new-tokens", "300", "--max-models", "3", "--max-generations", "2", "--max-sessions", "7",
                  "--max-prompt-chars", "900", "--capture-threads", "3")
    assert cmd[cmd.index("--allow-websocket-origin") + 1] == "team.example:5006"
    assert cmd[cmd.index("--prefix") + 1] == "/ts" and cmd.index("--prefix") < cmd.index("--args")
    cfg = ServeConfig.from_args(cmd[cmd.index("--args") + 1:], env={})  # what apps/trajscope.py reads
    assert cfg.data_dirs == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())
    assert cfg.models == ("sample", "gpt2")
    assert (cfg.max_new_tokens, cfg.max_models, cfg.max_generations, cfg.max_sessions, cfg.max_prompt_chars,
            cfg.capture_threads) == (300, 3, 2, 7, 900, 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if line.split()[3].endswith(f":{port}")]


def test_the_served_app_listens_on_localhost_only():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "trajscope.cli", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while not listening(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        addrs = listening(port)
        assert addrs and all(a in (f"127.0.0.1:{port}", f"[::1]:{port}") for a in addrs), addrs
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
