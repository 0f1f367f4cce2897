#!/usr/bin/env python3
"""GPU acceptance of the patch series: every claim the README makes about the GPU path, checked
on 2x A100-80GB (or H100) inside the patched image, and printed as one table.

    python -m dflash_ops.deployment_checks.gpu --model /models/Qwen3.8-Flash-Next-AWQ \\
        --draft /models/Qwen3.8-Flash-Next-DFlash2 [--gpu a100] [--dry-run]

Engines run one after another (two TP2 engines do not fit on one 2-GPU machine):

1. the series is applied to the importable vLLM;
2. the plan from the checkpoint's own config.json (`dflash-serve plan --config MODEL`);
3. DFlash2 at block 8 (k=7) started *without* --block-size: the engine's own log must set the
   planned block size and use the aux layers (6, 16, 26, 36, 46);
4. the fixed prompts at concurrency 1 and 4: mean acceptance length (>= --min-acceptance),
   output tokens/s and the per-position acceptance (required, not skipped when absent);
5. the reasoning parser (qwen3) and one qwen3_xml tool call;
6. a shared system prompt with the draft loaded: prefix-cache hits below one block;
7. capture overhead: the capture's own GPU work per decode step over the step time;
8. the same engine without speculation: greedy outputs token-identical at concurrency 1 and 4,
   and sampled outputs (temperature 1, concurrency 4) following the same distribution
   (`bench --check-sampled-lossless`'s test, on continuations collected from each engine);
9. the MTP-3 baseline on the same prompts: the seed's comparison (DFlash2 4.08 / 224.9 tok/s
   against MTP-3 2.98 / 180.1 at concurrency 1);
10. DFlash2 with a k schedule (SCHEDULE: k 7 for 1 to 2 running requests, 3 above): the k in
   effect (drafted tokens per draft) at concurrency 1 and 8 follows it.

`--dry-run` prints the plan and every command without a GPU. Exit status 0 only if every check
passes; a failed engine start, a timeout or a missing metric fails its check with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_ops.speculative_config import speculative_config_args
from dflash_ops.speculative_schedule import parse_schedule
from dflash_ops.speculative_setting import SpeculativeSetting

EXPECTED_AUX_LAYERS = "(6, 16, 26, 36, 46)"
SCHEDULE = "1-2:7,3-:3"


@dataclass
class Row:
    check: str
    measured: str
    expected: str
    ok: bool | None  # None: not run (dry run, or an earlier failure)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, check: str, measured: str, expected: str, ok: bool | None) -> bool:
        self.rows.append(Row(check, measured, expected, ok))
        mark = {True: "PASS", False: "FAIL", None: "-"}[ok]
        log(f"{mark} {check}: {measured} (expected {expected})")
        return bool(ok)

    def table(self) -> str:
        lines = ["| check | measured | expected | result |", "|---|---|---|---|"]
        for row in self.rows:
            result = {True: "PASS", False: "FAIL", None: "not run"}[row.ok]
            lines.append(f"| {row.check} | {row.measured} | {row.expected} | {result} |")
        return "\n".join(lines)


def log(message: str) -> None:
    print(f"[gpu-acceptance] {message}", file=sys.stderr, flush=True)


def run_json(argv: list[str], timeout: float = 600) -> Any:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


class Engine:
    """One `vllm serve` process with its log, stopped on exit."""

    def __init__(self, args: argparse.Namespace, name: str, extra: list[str]) -> None:
        self.name = name
        self.argv = [
            "vllm",
            "serve",
            args.model,
            "--served-model-name",
            "model",
            "--port",
            str(args.port),
            "--tensor-parallel-size",
            "2",
            "--enable-expert-parallel",
            "--mamba-cache-mode",
            "align",
            # As the chart: prefix-cache hits on 16-token boundaries (patch 0004 with a draft).
            "--prefix-match-unit",
            "16",
            "--reasoning-parser",
            "qwen3",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "qwen3_xml",
            "--engram-config",
            '{"cpu_offload": true}',
            *extra,
        ]
        self.log_path = args.work / f"engine-{name}.log"
        self.url = f"http://127.0.0.1:{args.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_timeout = args.startup_timeout

    def __enter__(self) -> Engine:
        log(f"starting {self.name}: {shlex.join(self.argv)} (log: {self.log_path})")
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        # Polls soon after the start (a warm or stand-in engine is up in a second), then every
        # 10 s while a cold engine loads.
        pause = 0.25
        while True:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n  " + "\n  ".join(tail)
                )
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=5).status == 200:
                    log(f"{self.name} ready")
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not healthy after {self.startup_timeout}s")
            time.sleep(pause)
            pause = min(pause * 2, 10.0)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def log_text(self) -> str:
        return str(self.log_path.read_text(errors="replace"))


class EngineDeployer:
    """`bench sweep`'s deployer on this GPU machine: one `vllm serve` per setting."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine: Engine | None = None

    def apply(self, setting: Any) -> str:
        self.finish()
        draft = self.args.draft if setting.method == "dflash" else None
        extra = setting.engine_args(draft)
        self.engine = Engine(self.args, setting.key, extra).__enter__()
        return self.engine.url

    def finish(self) -> None:
        if self.engine is not None:
            self.engine.__exit__(None, None, None)
            self.engine = None


REFERENCE_SETTINGS = [("mtp", 3), *(("dflash", k) for k in range(3, 8))]


def reference_table(args: argparse.Namespace) -> int:
    """The reference measurement through `bench sweep`: DFlash2 k 3..7 and MTP-3 at
    concurrency 1 and 4, the 10 fixed prompts, greedy; printed in the reference's layout."""
    from dflash_ops.bench.core.results import BenchSettings
    from dflash_ops.bench.core.runner import Level
    from dflash_ops.bench.core.sampling import Sampling
    from dflash_ops.bench.sweep.analysis import table
    from dflash_ops.bench.sweep.deployers import Setting
    from dflash_ops.bench.sweep.run import SweepPlan, load_results, run_sweep

    plan = SweepPlan(
        settings=[Setting(k, method) for method, k in REFERENCE_SETTINGS],  # type: ignore[arg-type]
        levels=[Level(concurrency=1), Level(concurrency=4)],
        bench=BenchSettings(
            prompt_set="fixed",
            input_len=256,
            max_tokens=256,
            num_requests=10,
            duration_s=None,
            repeats=3,
            warmup=2,
            seed=0,
            request_timeout_s=args.request_timeout,
            sampling=Sampling(temperature=args.temperature, ignore_eos=True),
        ),
        deployer="gpu-acceptance",
        schedule="off",  # the reference's settings only
    )
    out = args.work / "reference-sweep"
    analysis = run_sweep(out, plan, EngineDeployer(args), "model", None, None)
    results = load_results(out, plan)
    print("| setting | block | concurrency | mean acceptance length | output tok/s |")
    print("|---|---:|---:|---:|---:|")
    for setting in plan.settings:
        name = "MTP-3" if setting.method == "mtp" else "DFlash2"
        for level in results[setting].levels:
            spec = level.spec_decode
            mal = spec.mean_acceptance_length if spec and spec.mean_acceptance_length else None
            print(
                f"| {name} | {setting.k + 1} | {level.concurrency} | "
                f"{'n/a' if mal is None else f'{mal:.2f}'} | "
                f"{level.output_tokens_per_s.mean:.1f} ± {level.output_tokens_per_s.stdev:.1f} |"
            )
    print()
    print(table(analysis))
    return 0


def bench(engine: Engine, args: argparse.Namespace, name: str, *extra: str) -> Any:
    out = args.work / f"bench-{name}"
    argv = [
        sys.executable,
        "-m",
        "dflash_ops.cli",
        "bench",
        "--base-url",
        engine.url,
        "--model",
        "model",
        "--max-tokens",
        "256",
        "--repeats",
        "1",
        "--num-requests",
        "10",
        "--out",
        str(out),
        "--format",
        "json",
        # Sampled as --temperature says (0, greedy, by default: the reference measurement's,
        # which --min-acceptance is calibrated on), to --max-tokens.
        "--temperature",
        f"{args.temperature:g}",
        "--ignore-eos",
        *extra,
    ]
    return run_json(argv, timeout=args.request_timeout * 20)


def greedy_ids(engine: Engine, concurrency: int, timeout: float) -> dict[str, list[int]]:
    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.prompts import fixed_prompts

    async def collect() -> dict[str, list[int]]:
        endpoint = Endpoint(engine.url, timeout_s=timeout)
        limit = asyncio.Semaphore(concurrency)

        async def one(prompt_id: str, text: str) -> tuple[str, list[int]]:
            async with limit:
                messages = [{"role": "user", "content": text}]
                return prompt_id, await endpoint.chat_token_ids("model", messages, 256)

        try:
            return dict(await asyncio.gather(*(one(i, t) for i, t in fixed_prompts())))
        finally:
            await endpoint.aclose()

    return asyncio.run(collect())


SAMPLED_CHECK_TEMPERATURE = 1.0
SAMPLED_CHECK_CONCURRENCY = 4


def sampled_continuations(
    engine: Engine, first_seed_index: int, timeout: float
) -> dict[str, list[list[int]]]:
    """The sampled lossless check's continuations from one engine (the engines run one after
    the other here, so each side is collected alone and the test runs afterwards)."""
    from dflash_ops.bench.core.client import Endpoint
    from dflash_ops.bench.core.lossless import collect
    from dflash_ops.bench.core.results import SampledCheckSettings
    from dflash_ops.bench.core.sampling import Sampling

    async def run() -> dict[str, list[list[int]]]:
        endpoint = Endpoint(engine.url, timeout_s=timeout)
        try:
            return await collect(
                endpoint,
                "model",
                Sampling(temperature=SAMPLED_CHECK_TEMPERATURE, ignore_eos=True),
                SampledCheckSettings(),
                SAMPLED_CHECK_CONCURRENCY,
                first_seed_index,
                engine.name,
            )
        finally:
            await endpoint.aclose()

    return asyncio.run(run())


def first_difference(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def capture_cost_ms(hidden_size: int, hc_count: int, tokens: int, layers: int) -> float:
    """GPU time of the capture's own work per decode step: the mean over the HC streams of the
    state each captured layer materializes anyway (patch 0001 reuses it)."""
    import torch

    state = torch.randn(tokens, hc_count * hidden_size, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        state.unflatten(-1, (hc_count, hidden_size)).mean(dim=-2)  # type: ignore[no-untyped-call]
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    repeats = 200
    start.record()
    for _ in range(repeats):
        for _ in range(layers):
            state.unflatten(-1, (hc_count, hidden_size)).mean(dim=-2)  # type: ignore[no-untyped-call]
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (with config.json)")
    parser.add_argument("--draft", required=True, help="the DFlash2 draft (directory or id)")
    parser.add_argument("--gpu", default="a100", choices=["a100", "h100"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--min-acceptance", type=float, default=3.0)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the benchmarks' sampling temperature (0: greedy, as the reference measurement and "
        "--min-acceptance; your traffic's, to see what it gets: lower --min-acceptance with it)",
    )
    parser.add_argument("--min-prefix-hit-rate", type=float, default=0.5)
    parser.add_argument("--startup-timeout", type=int, default=3600)
    parser.add_argument("--request-timeout", type=float, default=600)
    parser.add_argument("--work", type=Path, default=Path("gpu-acceptance"))
    parser.add_argument("--dry-run", action="store_true", help="print the plan and commands")
    parser.add_argument(
        "--reference-table",
        action="store_true",
        help="only reproduce the reference table (DFlash2 k 3..7 and MTP-3 at concurrency 1 "
        "and 4) through bench sweep; resumable in WORK/reference-sweep",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.reference_table and not args.dry_run:
        return reference_table(args)
    report = Report()
    config_path = Path(args.model) / "config.json"
    plan_argv = [
        sys.executable,
        "-m",
        "dflash_ops.cli",
        "plan",
        "--gpu",
        args.gpu,
        "--tp",
        "2",
        "--k",
        "3-7",
        "--draft-model",
        args.draft,
        "--format",
        "json",
    ]
    if config_path.is_file():
        plan_argv += ["--config", str(config_path)]
    else:
        log(f"{config_path} not found: planning with the bundled reference config")
    plan = run_json(plan_argv)
    block = plan["recommended_block_size"]["7"]
    dflash = speculative_config_args("dflash", 7, args.draft)
    mtp = speculative_config_args("mtp", 3)
    scheduled = SpeculativeSetting(7, "dflash", parse_schedule(SCHEDULE, 7)).engine_args(args.draft)
    if args.dry_run:
        print(
            f"plan: block size {block} at k=7 ({args.gpu}, TP2); per k: "
            f"{plan['recommended_block_size']}"
        )
        engines: tuple[tuple[str, list[str]], ...] = (
            ("dflash2", dflash), ("no speculation", []), ("mtp3", mtp),
            ("dflash2-schedule", scheduled),
        )  # fmt: skip
        for name, extra in engines:
            engine = Engine(args, name, extra)
            print(f"{name}: {shlex.join(engine.argv)}")
        print(
            f"then, against each: {sys.executable} -m dflash_ops.cli bench --base-url "
            f"http://127.0.0.1:{args.port} --model model --concurrency 1,4 --max-tokens 256"
        )
        return 0

    report.add(
        "series applied",
        "checked",
        "dflash-serve patches check --require-applied",
        subprocess.run(
            [sys.executable, "-m", "dflash_ops.cli", "patches", "check", "--require-applied"]
        ).returncode
        == 0,
    )
    results: dict[str, Any] = {}
    try:
        with Engine(args, "dflash2", dflash) as engine:
            text = engine.log_text()
            chosen = re.findall(r"Setting attention block size to (\d+) tokens", text)
            report.add(
                "automatic block size (no --block-size)",
                chosen[-1] if chosen else "none",
                f"{block} (the plan)",
                bool(chosen) and int(chosen[-1]) == block,
            )
            report.add(
                "aux layers",
                "named" if EXPECTED_AUX_LAYERS in text else "not in the log",
                EXPECTED_AUX_LAYERS,
                EXPECTED_AUX_LAYERS in text,
            )
            results["dflash"] = bench(engine, args, "dflash2", "--concurrency", "1,4")
            c1 = results["dflash"]["levels"][0]
            spec = c1["spec_decode"] or {}
            mal = spec.get("mean_acceptance_length")
            per_pos = spec.get("per_position_acceptance") or []
            report.add(
                "mean acceptance length, c=1",
                f"{mal:.2f}" if mal else "none",
                f">= {args.min_acceptance} (seed 4.08)",
                mal is not None and mal >= args.min_acceptance,
            )
            report.add(
                "per-position acceptance",
                ", ".join(f"{p:.2f}" for p in per_pos) or "none",
                "7 positions, position 0 >= 0.5",
                len(per_pos) == 7 and per_pos[0] >= 0.5,
            )
            import httpx

            from dflash_ops.deployment_checks import helm_test

            with httpx.Client(base_url=engine.url, timeout=args.request_timeout) as client:
                for name, check in (
                    ("reasoning + answer", helm_test.chat),
                    ("qwen3_xml tool call", helm_test.tool_call),
                ):
                    try:
                        report.add(name, check(client, "model"), "passes", True)
                    except (helm_test.CheckFailed, httpx.HTTPError) as err:
                        report.add(name, str(err), "passes", False)
                reply = client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "model",
                        "max_tokens": 512,
                        "temperature": 0,
                        "messages": [{"role": "user", "content": "Is 97 prime? Think first."}],
                    },
                )
                message = reply.json()["choices"][0]["message"] if reply.status_code == 200 else {}
                thought = message.get("reasoning_content") or message.get("reasoning")
                report.add(
                    "qwen3 reasoning parser",
                    "reasoning returned"
                    if thought
                    else f"no reasoning field ({reply.status_code})",
                    "separate reasoning",
                    bool(thought),
                )
            shared = bench(
                engine,
                args,
                "shared-prefix",
                "--concurrency",
                "1",
                "--prompts",
                "shared-prefix",
                "--input-len",
                "700",
            )
            hit = (shared["levels"][0]["prefix_cache"] or {}).get("hit_rate")
            report.add(
                "prefix-cache hit rate, shared 1,000-token prompt (below one block), draft loaded",
                f"{hit:.2f}" if hit is not None else "not exported",
                f">= {args.min_prefix_hit_rate}",
                hit is not None and hit >= args.min_prefix_hit_rate,
            )
            disabled = "Disabling fine-grained prefix-cache hits" in engine.log_path.read_text(
                errors="replace"
            )
            report.add(
                "fine-grained prefix hits with the sliding-window draft group (patch 0004)",
                "disabled by vLLM" if disabled else "kept",
                "no 'Disabling fine-grained prefix-cache hits' in the log",
                not disabled,
            )
            itl = (c1.get("itl_ms") or {}).get("p50")
            cost = capture_cost_ms(2560, 4, tokens=8, layers=5)
            share = cost / itl if itl else None
            report.add(
                "capture overhead per decode step",
                f"{cost:.4f} ms of {itl or 0:.2f} ms"
                + (f" = {100 * share:.3f}%" if share is not None else ""),
                "< 0.5%",
                share is not None and share < 0.005,
            )
            ids = {c: greedy_ids(engine, c, args.request_timeout) for c in (1, 4)}
            sampled = sampled_continuations(engine, 0, args.request_timeout)
        with Engine(args, "no speculation", []) as engine:
            reference = {c: greedy_ids(engine, c, args.request_timeout) for c in (1, 4)}
            sampled_reference = sampled_continuations(engine, 10**6, args.request_timeout)
        from dflash_ops.bench.core.two_sample import permutation_test

        outcome = permutation_test(
            sampled, sampled_reference, sides=("with speculation", "without")
        )
        where = outcome.findings[0] if outcome.findings else None
        report.add(
            f"sampled lossless, temperature {SAMPLED_CHECK_TEMPERATURE:g}, "
            f"concurrency {SAMPLED_CHECK_CONCURRENCY}",
            f"p = {outcome.p_value:.3g}"
            + (f"; {where.prompt} position {where.position}: {where.detail}" if where else ""),
            f"p > {outcome.alpha:g} (the target's distribution)",
            outcome.same,
        )
        for c in (1, 4):
            diverged = [
                f"{p} at token {first_difference(ids[c][p], t)}"
                for p, t in reference[c].items()
                if ids[c][p] != t
            ]
            empty = [p for p, t in ids[c].items() if not t]
            report.add(
                f"lossless at concurrency {c}",
                f"{len(reference[c]) - len(diverged)}/{len(reference[c])} identical"
                + (f"; first divergence: {diverged[0]}" if diverged else ""),
                "all token-identical, none empty",
                not diverged and not empty,
            )
        with Engine(args, "mtp3", mtp) as engine:
            results["mtp"] = bench(engine, args, "mtp3", "--concurrency", "1,4")
        d1, m1 = results["dflash"]["levels"][0], results["mtp"]["levels"][0]
        d_tps, m_tps = d1["output_tokens_per_s"]["mean"], m1["output_tokens_per_s"]["mean"]
        m_mal = (m1["spec_decode"] or {}).get("mean_acceptance_length")
        report.add(
            "DFlash2 vs MTP-3 at c=1 (mean acceptance length; tok/s)",
            f"{mal or 0:.2f} vs {m_mal or 0:.2f}; {d_tps:.1f} vs {m_tps:.1f} "
            f"({d_tps / m_tps:.2f}x)",
            "seed: 4.08 vs 2.98; 224.9 vs 180.1 (1.25x)",
            mal is not None and m_mal is not None and mal > m_mal and d_tps > m_tps,
        )
        with Engine(args, "dflash2-schedule", scheduled) as engine:
            levels = bench(engine, args, "dflash2-schedule", "--concurrency", "1,8")["levels"]
        k_at = [(level["spec_decode"] or {}).get("k_in_effect") for level in levels]
        report.add(
            f"k schedule {SCHEDULE}: k in effect at concurrency 1 / 8",
            " / ".join(f"{k:.2f}" if k is not None else "none" for k in k_at),
            "7 / 3 to 4 (below 3 running requests only as the level ends)",
            None not in k_at and k_at[0] >= 6.9 and 3.0 <= k_at[1] <= 4.0,  # type: ignore[operator]
        )
    except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as err:
        report.add("run", f"stopped: {err}", "every step completes", False)
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    print(report.table())
    ok = all(row.ok for row in report.rows)
    log("PASS" if ok else "FAIL: see the table above and the engine logs in " + str(args.work))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
