"""`dflash-serve patches check|apply|revert`: the vLLM 0.33.0 patch series."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from dflash_ops.errors import UserError
from dflash_ops.model_profiles import PROFILE_NAMES, profile


def default_site_packages() -> Path | None:
    """The site-packages holding the importable `vllm`, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent.parent


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "patches",
        help="check, apply or revert the vLLM 0.33.0 patch series",
        description=(
            "Apply the dflash-serve patch series to an installed vllm==0.33.0. Refuses any other "
            "version, names the file and hunk that does not apply, and is idempotent."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("check", "report each patch's state; fail if a pending patch would not apply"),
        ("apply", "apply every pending patch (all or nothing)"),
        ("revert", "restore the original vLLM files byte for byte"),
    ):
        sub = actions.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--site-packages",
            type=Path,
            help="directory that contains vllm/ (default: where the importable vllm lives)",
        )
        sub.add_argument("--series-dir", type=Path, help="patches/ directory (default: bundled)")
        sub.add_argument("--format", choices=["text", "json"], default="text")
        if name == "check":
            sub.add_argument(
                "--require-applied",
                action="store_true",
                help="exit 1 unless every patch is applied (image self check)",
            )
            sub.add_argument(
                "--model",
                choices=PROFILE_NAMES,
                help="say which patches this model relies on; with --require-applied, require "
                "only those",
            )
        sub.set_defaults(handler=run)


def relied_on(model: str | None, files: list[str]) -> set[str]:
    """The patch files a model relies on (model_profiles: by number); every one without a
    model."""
    if model is None:
        return set(files)
    numbers = profile(model).patches
    return {f for f in files if f.split("-", 1)[0] in numbers}


def run(args: argparse.Namespace) -> int:
    from dflash_patches import series

    site_packages = args.site_packages or default_site_packages()
    if site_packages is None:
        raise UserError("vllm is not importable here: pass --site-packages DIR")
    series_dir = args.series_dir or series.SERIES_DIR
    try:
        if args.action == "check":
            states = series.check(site_packages, series_dir)
            relied = relied_on(args.model, [s.file for s in states])
            applied = all(s.state == series.PatchState.APPLIED for s in states if s.file in relied)
            if args.format == "json":
                print(json.dumps([s.model_dump(mode="json") for s in states], indent=2))
            else:
                for s in states:
                    used = "" if args.model is None else (
                        f" ({args.model} relies on it)" if s.file in relied
                        else f" (not used by {args.model})"
                    )  # fmt: skip
                    print(f"{s.file}: {s.state.value}{used}")
            if args.require_applied and not applied:
                what = "the patch series is" if args.model is None else (
                    f"a patch {args.model} relies on is"
                )  # fmt: skip
                print(f"error: {what} not fully applied", file=sys.stderr)
                return 1
            return 0
        done = (series.apply if args.action == "apply" else series.revert)(
            site_packages, series_dir
        )
    except series.PatchError as err:
        print(f"dflash-serve patches {args.action}: error: {err}", file=sys.stderr)
        # A series directory that is not one is bad input (2, as every UserError); a series
        # that does not apply is the check's answer (1).
        return 2 if isinstance(err, series.ManifestError) else 1
    if args.format == "json":
        print(json.dumps(done, indent=2))
    else:
        print("\n".join(done))
    manifest = series.load_manifest(series_dir)
    print(
        f"series {manifest.series_sha256[:16]} for "
        f"{manifest.distribution}=={manifest.vllm_version} in {site_packages}"
    )
    return 0
