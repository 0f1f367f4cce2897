"""The GPU acceptance script on CPU: its dry run, and that it checks what the docs claim."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

STEPS = REPO_ROOT / "ops" / "dflash_ops" / "deployment_checks" / "gpu_steps.py"


def dry_run(model: Path, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.deployment_checks.gpu", "--model", str(model),
         "--draft", "d2", "--dry-run", "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def test_dry_run_prints_the_plan_and_every_command(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = REPO_ROOT / "ops" / "dflash_ops" / "data" / "qwen3.8-flash-next.config.json"
    (model / "config.json").write_text(config.read_text())
    lines = dry_run(model, tmp_path)
    assert lines[0].startswith("plan: block size 1680 at k=7 (a100, TP2, Qwen3.8-Flash-Next)")
    engines = {line.split(":", 1)[0]: shlex.split(line.split(": ", 1)[1]) for line in lines[1:5]}
    assert set(engines) == {"dflash2", "no speculation", "mtp3", "dflash2-schedule"}
    for argv in engines.values():
        assert argv[:3] == ["vllm", "serve", str(model)]
        assert "--block-size" not in argv  # the automatic size is what is proven
    spec = json.loads(engines["dflash2"][engines["dflash2"].index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": "d2", "num_speculative_tokens": 7}
    assert "--speculative-config" not in engines["no speculation"]
    scheduled = engines["dflash2-schedule"]
    spec = json.loads(scheduled[scheduled.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 7
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 7], [3, 65536, 3]]


def test_the_dry_run_of_glm_runs_its_engines_with_its_flags(tmp_path: Path) -> None:
    """GLM-5.3-Flash (found by the checkpoint's model_type): its plan at the asked TP, its
    parsers, no --engram-config, no MTP engine (not served) and no capture-overhead step (the
    capture is vLLM's own, not the series')."""
    model, draft = tmp_path / "glm", tmp_path / "draft"
    model.mkdir()
    draft.mkdir()
    config = REPO_ROOT / "ops" / "dflash_ops" / "data" / "glm-5.3-flash.config.json"
    (model / "config.json").write_text(config.read_text())
    fixture = REPO_ROOT / "tests" / "patches" / "fixtures" / "glm-dflash2-draft" / "config.json"
    (draft / "config.json").write_text(fixture.read_text())
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.deployment_checks.gpu", "--model", str(model),
         "--draft", str(draft), "--gpu", "h200", "--tp", "8", "--dry-run",
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: block size 1024 at k=7 (h200, TP8, GLM-5.3-Flash)")
    engines = {line.split(":", 1)[0]: shlex.split(line.split(": ", 1)[1]) for line in lines[1:4]}
    assert set(engines) == {"dflash2", "no speculation", "dflash2-schedule"}
    for argv in engines.values():
        assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
        assert argv[argv.index("--reasoning-parser") + 1] == "glm45"
        assert argv[argv.index("--tool-call-parser") + 1] == "glm47"
        assert "--engram-config" not in argv
    assert not any("capture_overhead" in line or "against_mtp" in line for line in lines)

    from dflash_ops.deployment_checks.gpu_steps import expected_aux_layers
    from dflash_ops.model_profiles import PROFILES

    glm, qwen = PROFILES["glm-5.3-flash"], PROFILES["qwen3.8-flash-next"]
    assert expected_aux_layers(str(draft), glm) == "(4, 12, 24, 36, 44)"
    assert expected_aux_layers("someone/draft", glm) is None
    assert expected_aux_layers(qwen.draft_model, qwen) == "(6, 16, 26, 36, 46)"


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.deployment_checks.gpu", "--model", str(tmp_path),
         "--draft", "d2", "--dry-run", "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "model_type 'llama' is neither model" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_dry_run_names_every_step_and_every_check_lives_in_one(tmp_path: Path) -> None:
    """The steps print in the order they run, each once; every function of gpu_steps that adds
    a row to the report is one of them (no check outside a step, none left unrun)."""
    import ast

    from dflash_ops.deployment_checks.gpu_steps import BEFORE, ENGINES

    lines = dry_run(tmp_path, tmp_path)
    shown = [line.split(": ")[1] for line in lines[lines.index("steps:") + 1 :] if line[:2] == "  "]
    expected = [step.__name__ for step in BEFORE]
    for planned in ENGINES:
        expected += [s.__name__ for s in planned.during] + [s.__name__ for s in planned.after]
    assert shown == expected and len(set(shown)) == len(shown)
    reporting = {
        node.name
        for node in ast.parse(STEPS.read_text()).body
        if isinstance(node, ast.FunctionDef)
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "add"
            for call in ast.walk(node)
        )
    }
    # run_steps adds the row that says where a run stopped.
    assert reporting - {"run_steps"} == set(shown) - {
        "outputs_with_speculation",
        "outputs_without_speculation",
        "threshold_static",
    }


def test_sync_check_every_gpu_claim_has_a_check() -> None:
    """A sync check of the script against the docs' GPU claims (the dry run above runs it)."""
    source = STEPS.read_text()
    for claim in (
        "automatic block size (no --block-size)",
        "aux layers",
        "mean acceptance length, c=1",
        "per-position acceptance",
        "{tools} tool call",
        "{reasoning} reasoning parser",
        "prefix-cache hit rate",
        "capture overhead per decode step",
        "lossless at concurrency",
        "sampled lossless, temperature",
        "DFlash2 vs MTP-3 at c=1",
        "k schedule {SCHEDULE}: k in effect",
        "k schedule {SCHEDULE} at its threshold with prefills joining",
    ):
        assert f'"{claim}' in source, claim


def test_reference_table_runs_the_sweep_with_one_engine_per_setting(tmp_path: Path) -> None:
    """--reference-table through bench sweep, with a stand-in `vllm` that serves the instant
    fake server: every setting gets its own engine with its own speculative config."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "vllm-calls.jsonl"
    (bin_dir / "vllm").write_text(
        f"#!{sys.executable}\n"
        "import json, sys, os\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "port = sys.argv[sys.argv.index('--port') + 1]\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'dflash_ops.bench.fake_server',\n"
        "         '--port', port, '--served-model-name', 'model'])\n"
    )
    (bin_dir / "vllm").chmod(0o755)
    from dflash_ops.loopback import free_port

    env = {**__import__("os").environ, "PATH": f"{bin_dir}:{__import__('os').environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ops.deployment_checks.gpu", "--model", str(tmp_path),
         "--draft", "d2", "--reference-table", "--work", str(tmp_path / "work"),
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| MTP-3", "| DFlash2"))]
    assert [tuple(r.split(" | ")[:3]) for r in rows] == [
        (f"| {name}", str(k + 1), str(c))
        for name, k in [("MTP-3", 3)] + [("DFlash2", k) for k in range(3, 8)]
        for c in (1, 4)
    ]
    engines = [json.loads(line) for line in calls.read_text().splitlines()]
    configs = [json.loads(argv[argv.index("--speculative-config") + 1]) for argv in engines]
    assert [(c["method"], c["num_speculative_tokens"]) for c in configs] == [
        ("mtp", 3),
        *(("dflash", k) for k in range(3, 8)),
    ]
    assert all(c.get("model") == "d2" for c in configs if c["method"] == "dflash")
    # Greedy to max_tokens, as the reference measurement, and the results say so.
    points = sorted((tmp_path / "work" / "reference-sweep" / "points").glob("*/results.json"))
    assert len(points) == 6
    for point in points:
        sampling = json.loads(point.read_text())["settings"]["sampling"]
        assert (sampling["temperature"], sampling["ignore_eos"]) == (0.0, True)


def test_the_schedule_at_its_threshold_passes_at_the_ratio_and_fails_below(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """schedule_at_threshold against static k 7 on the same requests: 0.90x at both levels
    passes, 0.89x at one fails, and the row shows both ratios."""
    import argparse

    from dflash_ops.deployment_checks import gpu_steps

    def levels(*tps: float) -> dict[str, object]:
        return {"levels": [{"output_tokens_per_s": {"mean": t}} for t in tps]}

    for scheduled, ok in (((90.0, 180.0), True), ((90.0, 178.0), False)):
        run = gpu_steps.Run(argparse.Namespace(), block=1680)
        run.results["threshold-static"] = levels(100.0, 200.0)
        monkeypatch.setattr(gpu_steps, "bench", lambda *a, s=scheduled: levels(*s))
        gpu_steps.schedule_at_threshold(run, engine=None)  # type: ignore[arg-type]
        (row,) = run.report.rows
        assert row.ok is ok and row.measured == f"0.90x / {scheduled[1] / 200:.2f}x", row
