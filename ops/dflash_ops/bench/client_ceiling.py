"""`dflash-serve bench client`: how many output tokens per second the benchmark client itself
sustains, against a server that answers instantly (`fake_server`, in its own process), side by
side with vLLM's `vllm bench serve` client on the same server when vLLM is importable.

The two clients run alternately, `repeats` times each, in one invocation: the machine's noise
hits both, and the ratio of their means is the figure to quote.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel

from dflash_ops.bench.core.client import Endpoint
from dflash_ops.bench.core.prompts import RandomShape, build
from dflash_ops.bench.core.results import BenchSettings
from dflash_ops.bench.core.run_directory import RunDirectory
from dflash_ops.bench.core.runner import Level, Progress, run_pass
from dflash_ops.bench.core.sampling import Sampling
from dflash_ops.bench.core.token_counter import load_tokenizer
from dflash_ops.errors import UserError
from dflash_ops.loopback import start_server

VLLM_CLIENT = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


# Both clients send sampled requests (ours a seed per request too), as users' traffic is.
SAMPLING = Sampling(temperature=1.0, top_p=0.95, ignore_eos=True)


class ClientCeiling(BaseModel):
    concurrency: int
    requests: int
    max_tokens: int
    sampling: str = SAMPLING.describe()
    ours_tokens_per_s: list[float]
    vllm_tokens_per_s: list[float]

    @property
    def ratio(self) -> float | None:
        if not self.vllm_tokens_per_s:
            return None
        return statistics.fmean(self.ours_tokens_per_s) / statistics.fmean(self.vllm_tokens_per_s)


async def _ours(url: str, concurrency: int, requests: int, max_tokens: int, work: Path) -> float:
    endpoint = Endpoint(url, sampling=SAMPLING)
    # Every request written to requests.jsonl as it completes, as a real run does.
    directory = RunDirectory(work / "ours")
    try:
        # The same 32 tokens of the same tokenizer as vllm bench serve's random prompts.
        tokenizer = load_tokenizer(str(_tokenizer_dir()))
        prompts = build("random", requests, RandomShape(input_len=32), tokenizer=tokenizer)
        settings = BenchSettings(
            prompt_set="random", input_len=32, input_unit="tokens", max_tokens=max_tokens,
            num_requests=requests,
            duration_s=None, repeats=1, warmup=0, seed=0, sampling=SAMPLING,
        )  # fmt: skip
        run, _ = await run_pass(
            endpoint,
            "fake",
            prompts,
            Level(concurrency=concurrency),
            settings,
            0,
            Progress("dflash-serve bench:", requests, stream=open(os.devnull, "w")),  # noqa: SIM115
            on_record=lambda record: directory.record("ceiling", 1, record),
        )
    finally:
        await endpoint.aclose()
        directory.close()
    if run.failed:
        raise UserError(f"{run.failed} requests failed against the instant server")
    return run.output_tokens_per_s


def _tokenizer_dir() -> Path:
    """A tokenizer for `vllm bench serve` to build its random prompts with (no hub)."""
    from dflash_ops.local.tiny_model import train_tokenizer

    directory = Path(tempfile.gettempdir()) / "dflash-serve-bench-tokenizer"
    if not (directory / "tokenizer.json").is_file():
        train_tokenizer(directory, 2048)
    return directory


def _vllm(url: str, concurrency: int, requests: int, max_tokens: int, work: Path) -> float:
    result = work / "vllm.json"
    result.unlink(missing_ok=True)
    args = [
        "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
        "--model", "fake", "--tokenizer", str(_tokenizer_dir()), "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", str(max_tokens),
        "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--temperature", f"{SAMPLING.temperature:g}",
        "--top-p", f"{SAMPLING.top_p:g}",
        "--disable-tqdm", "--save-result", "--result-dir", str(work),
        "--result-filename", result.name,
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", VLLM_CLIENT, *args], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0 or not result.is_file():
        raise UserError(f"vllm bench serve failed: {done.stderr.strip()[-500:]}")
    return float(json.loads(result.read_text())["output_throughput"])


def vllm_client_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm.benchmarks.serve") is not None


def measure(
    concurrency: int, requests: int, max_tokens: int, repeats: int, against_vllm: bool
) -> ClientCeiling:
    process, url = start_server("dflash_ops.bench.fake_server")
    ours: list[float] = []
    theirs: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as work:
            for i in range(repeats):
                ours.append(asyncio.run(_ours(url, concurrency, requests, max_tokens, Path(work))))
                line = f"  run {i + 1}/{repeats}: dflash-serve bench {ours[-1]:,.0f} tok/s"
                if against_vllm:
                    theirs.append(_vllm(url, concurrency, requests, max_tokens, Path(work)))
                    line += f", vllm bench serve {theirs[-1]:,.0f} tok/s"
                print(line, file=sys.stderr, flush=True)
    finally:
        process.terminate()
        process.wait(timeout=10)
    return ClientCeiling(
        concurrency=concurrency,
        requests=requests,
        max_tokens=max_tokens,
        ours_tokens_per_s=ours,
        vllm_tokens_per_s=theirs,
    )
