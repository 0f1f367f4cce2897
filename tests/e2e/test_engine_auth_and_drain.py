"""The chart's auth and drain settings against a real vLLM CPU engine.

Auth: the engine started with VLLM_API_KEY (what auth.apiKeySecret gives it); the sidecar with
the same key is ready, without it names the 401 and the fix; bench with the key measures,
without it stops with the fix; the key shows nowhere in what the sidecar serves or logs.

Drain: the engine started with the chart's --shutdown-timeout gets SIGTERM while a stream's
request is in its engine core (what the kubelet sends after the preStop hook); the stream
finishes. With vLLM's default (0, abort) the same stream is cut, which is what the chart's flag
prevents.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dflash_ops.chart.helm import engine_args_in_render, helm_template
from dflash_ops.local import stack
from dflash_ops.local.tiny_model import TinyModelSpec
from dflash_ops.loopback import free_port

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e

KEY = "sk-test-9f1c2b"  # what the Secret holds
SERVED = "tiny"
TINY_MAX_POSITIONS = TinyModelSpec().max_position_embeddings


def chart_shutdown_timeout() -> int:
    args = engine_args_in_render(helm_template([], [], "dflash", "llm"))
    return int(args[args.index("--shutdown-timeout") + 1])


def status_of(url: str, headers: dict[str, str] | None = None) -> int | None:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=30
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


class Engine:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def start_engine(
    work: Path,
    models_dir: Path,
    shutdown_timeout: int,
    key: str | None,
    max_model_len: int = TINY_MAX_POSITIONS,
) -> Engine:
    (work / "models").symlink_to(models_dir)
    config = stack.StackConfig(state_dir=work, method="off")
    stack.ensure_models(config)
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(config.target_dir.resolve()), "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(max_model_len), "--enforce-eager",
        "--shutdown-timeout", str(shutdown_timeout),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    if max_model_len > TINY_MAX_POSITIONS:
        # The tiny model's RoPE computes any position; vLLM asks for consent past its config's.
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    env.pop("VLLM_API_KEY", None)
    if key is not None:
        env["VLLM_API_KEY"] = key
    log = work / "engine.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    engine = Engine(process, port, log)
    deadline = time.monotonic() + 600
    while status_of(engine.url + "/health") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            raise AssertionError("the engine did not start:\n" + log.read_text()[-3000:])
        time.sleep(1)
    return engine


@pytest.fixture(scope="module")
def keyed_engine(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator[Engine]:
    engine = start_engine(tmp_path_factory.mktemp("auth"), models_dir, 10, KEY)
    yield engine
    engine.stop()


# -- auth ----------------------------------------------------------------------------------


def test_the_engine_guards_v1_only(keyed_engine: Engine) -> None:
    assert status_of(keyed_engine.url + "/health") == 200
    assert status_of(keyed_engine.url + "/metrics") == 200  # Prometheus scrapes without a key
    assert status_of(keyed_engine.url + "/v1/models") == 401
    bearer = {"Authorization": f"Bearer {KEY}"}
    assert status_of(keyed_engine.url + "/v1/models", bearer) == 200


def start_sidecar(
    engine: Engine, work: Path, key: str | None
) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_SIDECAR_")}
    env.pop("VLLM_API_KEY", None)
    if key is not None:
        env["VLLM_API_KEY"] = key
    log = work / f"sidecar-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "dflash_ops.cli", "sidecar", "--engine-url", engine.url,
                "--host", "127.0.0.1", "--port", str(port), "--scrape-interval", "0.5",
                "--scrape-timeout", "0.9", "--windows", "10s", "--verdict-window", "10s",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return process, f"http://127.0.0.1:{port}", log


def readiness_after(url: str, want_ready: bool, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(url + "/readyz", timeout=5)
            body = reply.json()
            if body.get("ready") is want_ready and (want_ready or "401" in body.get("reason", "")):
                return body
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"readiness never became {want_ready}: {body}")


@pytest.mark.parametrize("with_key", [True, False], ids=["with-key", "without-key"])
def test_the_sidecar_is_ready_with_the_key_and_names_the_401_without(
    keyed_engine: Engine, tmp_path: Path, with_key: bool
) -> None:
    process, url, log = start_sidecar(keyed_engine, tmp_path, KEY if with_key else None)
    try:
        body = readiness_after(url, want_ready=with_key)
        if not with_key:
            assert "401" in body["reason"] and "VLLM_API_KEY" in body["reason"]
            assert "auth.apiKeySecret" in body["reason"]
        served = (
            httpx.get(url + "/stats", timeout=30).text
            + httpx.get(url + "/metrics", timeout=30).text
        )
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert KEY not in served
    assert KEY not in log.read_text()


def run_bench(
    engine: Engine, out: Path, *extra: str, env_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("OPENAI_API_KEY", None)
    if env_key is not None:
        env["OPENAI_API_KEY"] = env_key
    return subprocess.run(
        [
            sys.executable, "-m", "dflash_ops.cli", "bench", "--base-url", engine.url,
            "--concurrency", "2", "--num-requests", "4", "--repeats", "1",
            "--max-tokens", "8", "--temperature", "0", "--ignore-eos", "--out", str(out),
            *extra,
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_bench_sends_the_key_and_says_what_is_missing(keyed_engine: Engine, tmp_path: Path) -> None:
    with_flag = run_bench(keyed_engine, tmp_path / "flag", "--api-key", KEY)
    assert with_flag.returncode == 0, with_flag.stderr[-2000:]
    results = json.loads((tmp_path / "flag" / "results.json").read_text())
    assert KEY not in json.dumps(results)
    from_env = run_bench(keyed_engine, tmp_path / "env", env_key=KEY)  # as vllm bench serve
    assert from_env.returncode == 0, from_env.stderr[-2000:]
    without = run_bench(keyed_engine, tmp_path / "none")
    assert without.returncode != 0 and "401" in without.stderr and "--api-key" in without.stderr
    assert "Traceback" not in without.stderr


# -- drain -----------------------------------------------------------------------------------


def stream_through_sigterm(
    engine: Engine, max_tokens: int, cut_after_s: float
) -> tuple[str | None, int, float]:
    """Stream a completion; SIGTERM the engine at the first chunk. Returns the finish reason,
    the completion tokens received and how long the stream ran after SIGTERM; `cut_after_s`
    without a chunk counts as the stream cut. The client is a process in a session of its own
    (tests/e2e/drain_client.py says why)."""
    done = subprocess.run(
        [
            sys.executable, "-m", "tests.e2e.drain_client", engine.url, str(engine.process.pid),
            "--model", SERVED, "--max-tokens", str(max_tokens),
            "--cut-after-s", str(cut_after_s),
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, start_new_session=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    return result["finish"], int(result["tokens"]), float(result["after_s"])


@pytest.mark.parametrize("mode", ["chart", "vllm-default"])
def test_sigterm_mid_stream_drains_with_the_charts_timeout(
    tmp_path: Path, models_dir: Path, mode: str
) -> None:
    # The request must outlast the way from its first chunk to the SIGTERM reaching the engine
    # core: with 1,500 tokens a loaded machine once had the engine core finish before the client
    # read its fifth chunk (and with 8,000 a client in the test's session, see drain_client).
    # The chart's mode must drain all of it within its timeout: 8,000 tokens (16 s at 500 tok/s
    # here idle). vLLM's default cuts the stream, so its request can be as long as the KV cache
    # allows at no cost: 120,000 tokens, minutes of generation. A draining stream counts as cut
    # only after 30 s without a chunk (a loaded machine may hold the API server back for
    # seconds); vLLM's default is expected to cut it, so 5 s tell.
    if mode == "chart":
        timeout, max_model_len, max_tokens = chart_shutdown_timeout(), TINY_MAX_POSITIONS, 8000
        cut_after_s = 30.0
    else:
        timeout, max_model_len, max_tokens = 0, 131072, 120000
        cut_after_s = 5.0
    engine = start_engine(tmp_path, models_dir, timeout, key=None, max_model_len=max_model_len)
    try:
        finish, tokens, after = stream_through_sigterm(engine, max_tokens, cut_after_s)
        engine.process.wait(timeout=timeout + 60)
    finally:
        engine.stop()
    log = engine.log.read_text(errors="replace")
    if mode == "chart":
        assert "draining in-flight requests count=1" in log, log[-3000:]
        assert finish == "length" and tokens == max_tokens, (finish, tokens, log[-2000:])
        assert "mode=drain" in log
        assert engine.process.returncode is not None
    else:
        # The failure the chart's flag prevents: vLLM aborts the request on SIGTERM. (Whether
        # the engine core logs the abort before the API server kills it is a race: not read.)
        assert not (finish == "length" and tokens == max_tokens), (finish, tokens, after)
        assert "mode=abort" in log
