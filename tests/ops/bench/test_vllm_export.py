"""A run's vLLM-format export is read by vLLM 0.33.0's own tooling: `vllm bench sweep plot` and
`plot_pareto` (run in .venv-vllm033) draw it without error and read the same throughput and
TTFT as results.json and requests.jsonl hold."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dflash_ops.bench.core import vllm_export

from tests.conftest import REPO_ROOT

VLLM_PYTHON = REPO_ROOT / ".venv-vllm033" / "bin" / "python"

READ_WITH_VLLM = r"""
import json, sys
from pathlib import Path
from vllm.benchmarks.sweep.plot import PlotBinners, PlotFilters, _json_load_bytes, plot
from vllm.benchmarks.sweep.plot_pareto import _prepare_records, plot_pareto

root, figures = Path(sys.argv[1]), Path(sys.argv[2])
plot(root, figures, fig_by=[], row_by=[], col_by=[], curve_by=["max_concurrency"],
     var_x="p99_ttft_ms", var_y="output_throughput", filter_by=PlotFilters(),
     bin_by=PlotBinners(), scale_x=None, scale_y=None, dry_run=False, fig_dpi=50)
# As `vllm bench sweep plot_pareto DIR` calls it (its CLI's defaults)
plot_pareto(root, user_count_var="max_concurrency", gpu_count_var=None,
            label_by=["max_concurrency", "gpu_count"], dry_run=False)
records = [r for p in sorted(root.rglob("**/summary.json")) for r in _json_load_bytes(p)]
prepared, skipped = _prepare_records(
    records, user_count_var="max_concurrency", gpu_count_var=None)
print(json.dumps({"skipped": skipped, "records": [
    {k: r[k] for k in ("max_concurrency", "run_number", "output_throughput", "mean_ttft_ms",
                       "p50_ttft_ms", "tokens_per_user", "label", "tp")}
    for r in prepared]}))
"""


def bench(base_url: str, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_ops.cli", "bench", "--base-url", base_url,
         "--result-dir", str(out), "--concurrency", "1,2", "--num-requests", "4",
         "--repeats", "2", "--warmup", "0", "--max-tokens", "8", "--temperature", "0", *flags],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip


@pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="needs .venv-vllm033 (make setup) for vLLM's plot helpers"
)
def test_vllms_sweep_plots_read_the_export_with_our_figures(
    instant_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = bench(
        instant_server, out, "--label", "ours", "--metadata", "tp=2",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    read = subprocess.run(
        [str(VLLM_PYTHON), "-c", READ_WITH_VLLM, str(out / "vllm"), str(tmp_path / "figures")],
        capture_output=True, text=True, timeout=600, env=os.environ | {"MPLBACKEND": "Agg"},
    )  # fmt: skip
    assert read.returncode == 0, read.stderr[-3000:]
    theirs = json.loads(read.stdout.strip().splitlines()[-1])
    assert theirs["skipped"] == 0 and len(theirs["records"]) == 4  # 2 levels x 2 runs
    assert list((tmp_path / "figures").glob("*.png"))
    assert list((out / "vllm" / "pareto").glob("*.png"))
    ours = json.loads((out / "results.json").read_text())
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    by_key = {(r["max_concurrency"], r["run_number"]): r for r in theirs["records"]}
    for level in ours["levels"]:
        for index, run in enumerate(level["runs"]):
            record = by_key[(level["concurrency"], index)]
            assert record["output_throughput"] == pytest.approx(run["output_tokens_per_s"])
            ttfts = [
                line["ttft_ms"]
                for line in lines
                if line["level"] == f"concurrency {level['concurrency']}"
                and line["run"] == index + 1
            ]
            assert record["mean_ttft_ms"] == pytest.approx(statistics.fmean(ttfts))
            assert record["p50_ttft_ms"] == pytest.approx(statistics.median(ttfts))
            assert record["tokens_per_user"] == pytest.approx(
                run["output_tokens_per_s"] / level["concurrency"]
            )
            assert (record["label"], record["tp"]) == ("ours", "2")


def test_save_result_writes_one_pooled_file_per_level_named_as_vllm_names_it(
    instant_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = bench(instant_server, out, "--save-result")
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(out.glob("openai-chat-infqps-concurrency*.json"))
    assert [f.name.split("-")[3] for f in files] == ["concurrency1", "concurrency2"]
    pooled = json.loads(files[1].read_text())
    ours = json.loads((out / "results.json").read_text())["levels"][1]
    assert pooled["completed"] == 8 and pooled["num_prompts"] == 8 and pooled["failed"] == 0
    wall = sum(run["wall_s"] for run in ours["runs"])
    tokens = sum(run["output_tokens"] for run in ours["runs"])
    assert pooled["output_throughput"] == pytest.approx(tokens / wall)
    assert {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"} <= set(pooled)
    assert "p99_e2el_ms" not in pooled  # vLLM's default --percentile-metrics
    named = bench(
        instant_server, tmp_path / "one", "--concurrency", "2", "--result-filename", "x.json"
    )
    assert named.returncode == 0, named.stderr[-3000:]
    assert json.loads((tmp_path / "one" / "x.json").read_text())["max_concurrency"] == 2
    refused = bench(instant_server, tmp_path / "two", "--result-filename", "x.json")
    assert refused.returncode == 2 and "for a run of one level" in refused.stderr


def test_percentiles_are_numpys_linear_interpolation() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0]
    assert vllm_export.percentile(values, 50) == 3.0
    assert vllm_export.percentile(values, 99) == pytest.approx(8.8)
    assert vllm_export.percentile(values, 0) == 1.0 and vllm_export.percentile([2.0], 99) == 2.0


def test_an_earlier_runs_export_does_not_survive_a_new_run(
    instant_server: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert bench(instant_server, out).returncode == 0
    assert (out / "vllm" / "concurrency=2").is_dir()
    again = bench(instant_server, out, "--concurrency", "1")
    assert again.returncode == 0
    assert sorted(p.name for p in (out / "vllm").iterdir()) == ["concurrency=1"]


def test_records_of_a_level_export_their_speculative_counters() -> None:
    """vLLM's spec_decode_* keys from per-pass deltas: drafts-weighted positions."""
    from dflash_ops.bench.core.results import RunResult, SpecDecodeStats

    def run(drafts: float, accepted: float, positions: list[float]) -> RunResult:
        return RunResult(
            requests=1, failed=0, output_tokens=1, prompt_tokens=1, wall_s=1,
            output_tokens_per_s=1, requests_per_s=1,
            spec_decode=SpecDecodeStats(
                drafts=drafts, draft_tokens=drafts * 2, accepted=accepted,
                mean_acceptance_length=None, draft_acceptance_rate=None,
                per_position_acceptance=positions,
            ),
        )  # fmt: skip

    stats: dict[str, Any] = vllm_export._spec_decode(
        [run(10, 10, [0.6, 0.4]), run(30, 30, [0.8, 0.2])]
    )
    assert stats["spec_decode_num_drafts"] == 40 and stats["spec_decode_accepted_tokens"] == 40
    assert stats["spec_decode_acceptance_length"] == pytest.approx(2.0)
    assert stats["spec_decode_acceptance_rate"] == pytest.approx(50.0)
    assert stats["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.75, 0.25])
