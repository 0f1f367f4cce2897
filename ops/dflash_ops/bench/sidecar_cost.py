"""`dflash-serve bench sidecar`: the sidecar's cost per scrape cycle and its memory over a day.

The exposition is a real vLLM CPU engine recording (bundled), copied under several model labels
until it is about 3,000 lines, as a pod serving several engines would show. Each cycle feeds the
page, with counters advanced, through `EngineMonitor.ingest` (parse + window update), exactly
the per-scrape work of the sidecar minus the HTTP round trip.
"""

from __future__ import annotations

import gc
import json
import re
import statistics
import subprocess
import sys
import time
from importlib import resources

from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.settings import SidecarSettings
from pydantic import BaseModel

_NUMBER_AT_END = re.compile(
    r"^(vllm:(?:spec_decode_num_\w+_total|generation_tokens_total)\{.*\}) (\S+)$"
)


class SidecarCost(BaseModel):
    exposition_lines: int
    largest_page_bytes: int
    cycles: int
    p50_ms: float
    p99_ms: float
    parse_p50_ms: float
    reference_parse_p50_ms: float
    simulated_hours: float
    scrape_interval: float
    rss_mb: dict[str, float]


def large_exposition(target_lines: int = 3000) -> str:
    base = resources.files("dflash_ops.data").joinpath("vllm_cpu_metrics.prom").read_text()
    copies = [base]
    lines = base.count("\n")
    index = 1
    while lines < target_lines:
        copy = base.replace('model_name="tiny"', f'model_name="tiny-{index}"')
        copy = "\n".join(x for x in copy.splitlines() if not x.startswith("#"))
        copies.append(copy + "\n")
        lines += copy.count("\n") + 1
        index += 1
    return "".join(copies)


class _Advancing:
    """The page with every speculative counter advanced by `step` per cycle."""

    def __init__(self, text: str) -> None:
        self.parts: list[tuple[str, float] | str] = []
        for line in text.splitlines():
            match = _NUMBER_AT_END.match(line)
            self.parts.append((match.group(1), float(match.group(2))) if match else line)

    def at(self, cycle: int) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, tuple):
                out.append(f"{part[0]} {part[1] + cycle * 7.0}")
            else:
                out.append(part)
        return "\n".join(out) + "\n"


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def time_cycles(cycles: int, interval_s: float) -> tuple[int, list[float]]:
    page = _Advancing(large_exposition())
    monitor = EngineMonitor(SidecarSettings(scrape_interval=interval_s))
    texts = [page.at(i) for i in range(cycles)]  # built up front: only ingest is timed
    timings = []
    for i, text in enumerate(texts):
        started = time.perf_counter()
        monitor.ingest(text, now=i * interval_s)
        timings.append((time.perf_counter() - started) * 1000)
    return texts[0].count("\n"), timings


def time_parsers(rounds: int = 50) -> tuple[float, float]:
    """p50 ms of the sidecar's parser and of prometheus_client's on the same large page."""
    from dflash_sidecar import metrics_parser
    from prometheus_client.parser import text_string_to_metric_families

    text = large_exposition()
    ours, theirs = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        metrics_parser.parse(text)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        list(text_string_to_metric_families(text))
        theirs.append(time.perf_counter() - started)
    return statistics.median(ours) * 1000, statistics.median(theirs) * 1000


def simulate_day(hours: float, interval_s: float) -> dict[str, float]:
    """RSS of a process holding the sidecar app and one monitor fed `hours` of scrapes."""
    from dflash_sidecar.app import create_app

    settings = SidecarSettings(scrape_interval=interval_s)
    monitor = EngineMonitor(settings)
    create_app(settings, monitor)  # the same imports and objects as the running sidecar
    page = _Advancing(large_exposition())
    total = int(hours * 3600 / interval_s)
    marks = {
        max(1, int(total * f)): label for f, label in ((0.01, "start"), (0.5, "half"), (1.0, "end"))
    }
    rss: dict[str, float] = {}
    step = max(1, total // 20)
    for i in range(1, total + 1):
        monitor.ingest(page.at(i), now=i * interval_s)
        if i in marks:
            gc.collect()
            rss[marks[i]] = round(rss_mb(), 1)
        if i % step == 0:
            print(
                f"\r  simulating {hours:g} h of {interval_s:g} s scrapes: {100 * i // total}%",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    # Then the largest page the sidecar reads (max_page_bytes), full of label sets it must
    # count and drop: what a hostile or misconfigured exporter costs.
    hostile = largest_page(settings.max_page_bytes)
    for i in range(1, 21):
        monitor.ingest(hostile, now=(total + i) * interval_s)
    gc.collect()
    rss["largest page"] = round(rss_mb(), 1)
    return rss


def largest_page(limit: int) -> str:
    """A page just under `limit` bytes: the real exposition, then thousands of label sets of
    the families the sidecar reads."""
    parts = [large_exposition()]
    size, i = len(parts[0]), 0
    while True:
        labels = f'engine="{i}",model_name="flood-{i}"'
        block = (
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {i}.0\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {i}.0\n"
            f"vllm:generation_tokens_total{{{labels}}} {i}.0\n"
        )
        if size + len(block) > limit:
            return "".join(parts)
        parts.append(block)
        size += len(block)
        i += 1


def measure(cycles: int = 2000, hours: float = 24.0, interval_s: float = 2.0) -> SidecarCost:
    lines, timings = time_cycles(cycles, interval_s)
    parse_ms, reference_ms = time_parsers()
    # Memory in a fresh process, so the timing phase's pages do not count.
    child = subprocess.run(
        [sys.executable, "-m", "dflash_ops.bench.sidecar_cost", str(hours), str(interval_s)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    ordered = sorted(timings)
    return SidecarCost(
        exposition_lines=lines,
        largest_page_bytes=SidecarSettings().max_page_bytes,
        cycles=cycles,
        p50_ms=round(statistics.median(ordered), 3),
        p99_ms=round(ordered[int(len(ordered) * 0.99) - 1], 3),
        parse_p50_ms=round(parse_ms, 3),
        reference_parse_p50_ms=round(reference_ms, 3),
        simulated_hours=hours,
        scrape_interval=interval_s,
        rss_mb=json.loads(child.stdout.strip().splitlines()[-1]),
    )


if __name__ == "__main__":
    print(json.dumps(simulate_day(float(sys.argv[1]), float(sys.argv[2]))))
