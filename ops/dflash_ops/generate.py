"""Regenerate every committed generated file, or check that none has drifted.

    make generate          # python -m dflash_ops.generate: rewrite what changed
    make generate-check    # python -m dflash_ops.generate --check: exit 1 naming stale files

The files: the Grafana dashboards, the chart's block-size and KV-capacity tables, the chart's
rendered examples, the limits in values.schema.json that come from the planner, the README's
plan quotes, and the patch manifest (from the pinned vLLM wheel in .cache/wheels).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_ops.paths import CHART_DIR, DASHBOARDS_DIR, PROFILES_DIR, README, REPO_ROOT


@dataclass(frozen=True)
class Generated:
    path: Path
    render: Callable[[], str]


def _dashboard(name: str) -> Callable[[], str]:
    def render() -> str:
        from dflash_ops.observability.dashboards import render as dashboards

        return dashboards()[name]

    return render


def _example(profile: Path) -> Callable[[], str]:
    def render() -> str:
        from dflash_ops.chart.helm import EXAMPLE_NAMESPACE, EXAMPLE_RELEASE, helm_template

        return helm_template([profile], [], EXAMPLE_RELEASE, EXAMPLE_NAMESPACE)

    return render


def _schema() -> str:
    """values.schema.json with the limits the planner knows: TP sizes and the largest k."""
    from dflash_ops.chart.generated_files import block_size_table

    model = block_size_table()["model"]
    assert isinstance(model, dict)
    path = CHART_DIR / "values.schema.json"
    schema = json.loads(path.read_text())
    properties = schema["properties"]
    properties["engine"]["properties"]["tensorParallelSize"]["enum"] = model["tensorParallelSizes"]
    speculative = properties["speculative"]["properties"]["numSpeculativeTokens"]
    speculative["maximum"] = model["maxSpeculativeTokens"]
    return json.dumps(schema, indent=2) + "\n"


def _readme() -> str:
    from dflash_ops.chart.generated_files import render_readme

    return render_readme(README.read_text())


def _manifest() -> str:
    from dflash_patches.series import MANIFEST_NAME, SERIES_DIR, load_manifest

    from dflash_ops.errors import UserError

    wheel = REPO_ROOT / ".cache" / "wheels" / load_manifest().wheel
    if not wheel.is_file():
        raise UserError(f"{wheel} is missing: `make setup` fetches the pinned vLLM wheel")
    import hashlib
    import tempfile
    import zipfile

    from dflash_patches.series import build_manifest

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
        text = build_manifest(
            Path(tmp),
            SERIES_DIR,
            vllm_version="0.33.0",
            wheel=wheel.name,
            wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        )
    assert (SERIES_DIR / MANIFEST_NAME).is_file()
    return text


def targets() -> list[Generated]:
    from dflash_patches.series import MANIFEST_NAME, SERIES_DIR

    from dflash_ops.chart.generated_files import (
        BLOCK_SIZES,
        KV_CAPACITY,
        render_block_sizes,
        render_kv_capacity,
    )
    from dflash_ops.observability.dashboards import DASHBOARDS
    from dflash_ops.paths import EXAMPLES_DIR

    return [
        *(Generated(DASHBOARDS_DIR / name, _dashboard(name)) for name in DASHBOARDS),
        Generated(BLOCK_SIZES, render_block_sizes),
        Generated(CHART_DIR / "values.schema.json", _schema),
        Generated(KV_CAPACITY, render_kv_capacity),
        *(
            Generated(EXAMPLES_DIR / profile.name, _example(profile))
            for profile in sorted(PROFILES_DIR.glob("*.yaml"))
        ),
        Generated(README, _readme),
        Generated(SERIES_DIR / MANIFEST_NAME, _manifest),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    # The block-size table feeds the schema, the examples and the KV table: write it first.
    for target in targets():
        text = target.render()
        current = target.path.read_text() if target.path.is_file() else None
        if text == current:
            continue
        stale.append(target.path)
        if not args.check:
            target.path.parent.mkdir(parents=True, exist_ok=True)
            target.path.write_text(text)
            print(f"wrote {target.path.relative_to(REPO_ROOT)}", file=sys.stderr)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(REPO_ROOT)) for p in stale)
        print(f"stale generated files: {names}; run `make generate`", file=sys.stderr)
        return 1
    if not stale:
        print("every generated file is current", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
