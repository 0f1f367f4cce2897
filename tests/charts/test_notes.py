"""NOTES.txt as `helm install` prints it: the KV capacity it quotes is the planner's for the
release's values, and the plan command it prints otherwise runs."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from dflash_ops.chart.helm import helm_binary
from dflash_ops.cli import main
from dflash_ops.paths import CHART_DIR, PROFILES_DIR
from dflash_ops.plan.checkpoint import load_checkpoint
from dflash_ops.plan.planner import make_plan

CKPT = load_checkpoint()


def notes(*args: str) -> str:
    result = subprocess.run(
        [helm_binary(), "install", "t", str(CHART_DIR), "--dry-run=client", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split("\nNOTES:\n", 1)[1]


@pytest.mark.parametrize(
    ("profile", "gpu", "tp", "method", "k"),
    [
        (None, "a100", 2, "dflash", 7),
        ("a100-tp2-mtp3", "a100", 2, "mtp", 3),
        ("h100-tp2-dflash2", "h100", 2, "dflash", 7),
        ("a100-2node-tp4-ray", "a100", 4, "dflash", 7),
        ("spec-off", "a100", 2, "off", 0),
    ],
)
def test_notes_quote_the_planners_capacity(
    profile: str | None, gpu: str, tp: int, method: str, k: int
) -> None:
    args = ["-f", str(PROFILES_DIR / f"{profile}.yaml")] if profile else []
    text = notes(*args)
    capacity = make_plan(
        CKPT,
        gpu=gpu,
        tp=tp,
        ks=[k],
        method=method,
        max_model_len=65536,
        utilization=0.9,  # type: ignore[arg-type]
    ).capacity[k]
    assert f"{capacity.kv_cache_tokens} tokens at max_model_len 65536" in text
    r = capacity.requests_at
    assert f"{r[8192]} of 8k, {r[32768]} of 32k, {r[65536]} of 64k tokens" in text


def test_other_values_get_the_plan_command_and_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = notes("--set", "model.maxModelLen=32768", "--set", "engine.kvCacheDtype=fp8")
    assert "KV cache per rank" not in text
    command = re.search(r"Capacity and concurrency for this layout: (.+)", text)
    assert command is not None
    argv = shlex.split(command.group(1))
    assert argv[:2] == ["dflash-serve", "plan"]
    assert main(argv[1:]) == 0
    out = capsys.readouterr().out
    assert "max_model_len 32,768" in out and "KV cache fp8" in out
    table = out[out.index("KV cache per rank") :]
    row = next(line.split() for line in table.splitlines() if line.startswith("7 "))
    assert row[-1] == "-"  # 64k requests are longer than max_model_len: none, not a number


def test_notes_without_a_matching_entry_never_shows_stale_figures(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("model:\n  gpuMemoryUtilization: 0.85\n")
    assert "KV cache per rank" not in notes("-f", str(values))


def test_the_printed_request_sends_the_key_without_putting_it_on_a_command_line(
    tmp_path: Path,
) -> None:
    """The NOTES' curl command, run by bash as a user pastes it (kubectl a stand-in that prints
    the Secret's entry, curl the real one behind a wrapper that logs its arguments), reaches a
    server with the right Authorization header, and no command line carried the key."""
    import base64
    import http.server
    import os
    import threading

    from dflash_ops.loopback import free_port

    key = "sk-notes-7f3a"
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    text = notes("--set", "auth.apiKeySecret.name=keys", "--set", f"service.port={port}")
    command = text[text.index("  curl ") : text.index("}]}'", text.index("  curl ")) + 4]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    encoded = base64.b64encode(key.encode()).decode()
    (bin_dir / "kubectl").write_text(f"#!/bin/sh\necho '{encoded}'\n")
    (bin_dir / "curl").write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/argv\nexec {shutil.which("curl")} -sS "$@"\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert seen == [f"Bearer {key}"], seen
    argv = (tmp_path / "argv").read_text()
    assert "/v1/chat/completions" in argv and key not in argv, argv
