"""Fill the model cache before the engine starts (the chart's model-download init container).

    python download-models.py MODEL [MODEL ...]

Each MODEL is a Hugging Face id (downloaded into $HF_HOME, which the engine reads) or a path
(skipped: it is already on the cache volume). Files already in the cache are not fetched again,
so a restart resumes; several pods sharing a ReadWriteMany cache wait on the hub library's
per-file locks instead of fetching the same file twice. Progress goes to the log every
--report-seconds; the exit status is 0 once every model is complete.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path


def cache_bytes(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def report_progress(root: Path, every_s: float, stop: threading.Event) -> None:
    started, last = time.monotonic(), cache_bytes(root)
    while not stop.wait(every_s):
        now = cache_bytes(root)
        elapsed = time.monotonic() - started
        rate = (now - last) / every_s / 1e6
        print(
            f"[model-download] {now / 1e9:.1f} GB in the cache after {elapsed:.0f}s "
            f"({rate:.0f} MB/s)",
            flush=True,
        )
        last = now


def is_hub_id(model: str) -> bool:
    return not model.startswith(("/", ".")) and model.count("/") == 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--report-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    from huggingface_hub import snapshot_download

    root = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    reporter = threading.Thread(
        target=report_progress, args=(root, args.report_seconds, stop), daemon=True
    )
    reporter.start()
    model = ""
    try:
        for model in args.models:
            if not is_hub_id(model):
                print(f"[model-download] {model}: a path, not a hub id: skipped", flush=True)
                continue
            print(f"[model-download] {model}: downloading into {root}", flush=True)
            started = time.monotonic()
            path = snapshot_download(repo_id=model)
            print(
                f"[model-download] {model}: complete in {time.monotonic() - started:.0f}s ({path})",
                flush=True,
            )
    except Exception as err:  # the reason goes to the log; the pod restarts the container
        print(f"[model-download] {model}: failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
