"""`dflash-serve sidecar`: run the health and speculative-decoding metrics sidecar."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from dflash_ops.errors import UserError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sidecar",
        help="run the sidecar next to a vLLM engine (health, readiness, acceptance metrics)",
        description=(
            "Scrape a vLLM engine's /health and /metrics on loopback and serve /livez, /readyz, "
            "/metrics (dflash_* series) and /stats. Every flag can also be set with a "
            "DFLASH_SIDECAR_<NAME> environment variable (flags win)."
        ),
    )
    parser.add_argument("--engine-url", help="engine base URL (default http://127.0.0.1:8000)")
    parser.add_argument("--host", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="listen port (default 9100)")
    parser.add_argument("--scrape-interval", type=float, dest="scrape_interval_s")
    parser.add_argument("--scrape-timeout", type=float, dest="scrape_timeout_s")
    parser.add_argument("--windows", help="window lengths, e.g. 1m,5m,15m")
    parser.add_argument("--verdict-window", help="window the verdict and events follow (5m)")
    parser.add_argument("--canary-interval", type=float, dest="canary_interval_s")
    parser.add_argument("--served-model", help="model name for the canary (default: /v1/models)")
    parser.add_argument(
        "--kubernetes-events",
        action="store_true",
        default=None,
        help="emit Events on the pod when the verdict changes (needs POD_NAME/NAMESPACE)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from dflash_sidecar.app import create_app
    from dflash_sidecar.settings import from_env, parse_windows
    from pydantic import ValidationError

    try:
        settings = from_env(
            dict(os.environ),
            engine_url=args.engine_url,
            host=args.host,
            port=args.port,
            scrape_interval_s=args.scrape_interval_s,
            scrape_timeout_s=args.scrape_timeout_s,
            windows=parse_windows(args.windows) if args.windows else None,
            verdict_window=args.verdict_window,
            canary_interval_s=args.canary_interval_s,
            served_model=args.served_model,
            kubernetes_events=args.kubernetes_events,
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in err.errors()
        )
        raise UserError(f"invalid sidecar settings: {problems}") from None
    except ValueError as err:
        raise UserError(str(err)) from None
    if settings.kubernetes_events:
        import importlib.util

        if importlib.util.find_spec("kubernetes") is None:
            raise UserError(
                "--kubernetes-events needs the kubernetes client, which this install lacks: "
                "pip install 'dflash-serve[kubernetes]' (for the image: make images "
                "SIDECAR_EXTRAS=kubernetes)"
            )
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise
    logging.getLogger("dflash_sidecar").info(
        "watching %s every %.1fs; serving on %s:%d",
        settings.engine_base,
        settings.scrape_interval_s,
        settings.host,
        settings.port,
    )
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level
    )
    return 0
