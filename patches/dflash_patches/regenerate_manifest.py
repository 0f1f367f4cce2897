"""Maintainers: rewrite patches/manifest.json after editing a patch.

    python -m dflash_patches.regenerate_manifest --wheel path/to/vllm-0.33.0-...whl

The wheel is unpacked to a temporary directory, its sha256 recorded, and every patch applied
to the pristine sources to record the before/after hash of each target file.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import zipfile
from pathlib import Path

from dflash_patches.series import MANIFEST_NAME, SERIES_DIR, build_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="the vllm==0.33.0 wheel")
    parser.add_argument("--series-dir", type=Path, default=SERIES_DIR)
    args = parser.parse_args()
    wheel_sha256 = hashlib.sha256(args.wheel.read_bytes()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.wheel) as wheel:
            wheel.extractall(tmp)
        text = build_manifest(
            Path(tmp),
            args.series_dir,
            vllm_version="0.33.0",
            wheel=args.wheel.name,
            wheel_sha256=wheel_sha256,
        )
    (args.series_dir / MANIFEST_NAME).write_text(text)
    print(f"wrote {args.series_dir / MANIFEST_NAME}")


if __name__ == "__main__":
    main()
