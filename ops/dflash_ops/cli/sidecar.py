"""`dflash-serve sidecar`: run the health and speculative-decoding metrics sidecar.

Its flags are generated from the sidecar's settings (dflash_sidecar.settings): each also reads
from a DFLASH_SIDECAR_<NAME> variable, and --help shows the unit, default and variable of each.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

from dflash_ops.errors import UserError

if TYPE_CHECKING:
    from dflash_sidecar.settings import SidecarSettings


def register(subparsers: Any) -> None:
    from dflash_sidecar.settings import settings_spec

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sidecar",
        help="run the sidecar next to a vLLM engine (health, readiness, acceptance metrics)",
        description=(
            "Scrape a vLLM engine's /health and /metrics on loopback and serve /livez, /readyz, "
            "/livez/engine, /metrics (dflash_* series) and /stats. Every setting is a flag and a "
            "DFLASH_SIDECAR_<NAME> environment variable (flags win); durations are seconds. "
            "The engine's API key, when it requires one, only from VLLM_API_KEY."
        ),
    )
    for setting in settings_spec():
        if not setting.has_flag:
            continue
        if setting.is_flag_only_switch:
            parser.add_argument(
                setting.flag, action="store_true", default=None, help=setting.help()
            )
        else:
            parser.add_argument(
                setting.flag, dest=setting.name, metavar=setting.metavar, help=setting.help()
            )
    parser.set_defaults(handler=run)


def settings_from(args: argparse.Namespace, environ: dict[str, str]) -> SidecarSettings:
    """The settings the flags and DFLASH_SIDECAR_* variables give (flags win), or a UserError
    naming each invalid value."""
    from dflash_sidecar.settings import from_env, parse_windows, settings_spec
    from pydantic import ValidationError

    overrides: dict[str, object] = {}
    try:
        for setting in settings_spec():
            if not setting.has_flag:
                continue
            value = getattr(args, setting.name)
            if value is not None and setting.name == "windows":
                value = parse_windows(value)
            overrides[setting.name] = value
        return from_env(environ, **overrides)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in err.errors()
        )
        raise UserError(f"invalid sidecar settings: {problems}") from None
    except ValueError as err:
        raise UserError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from dflash_sidecar.app import create_app

    settings = settings_from(args, dict(os.environ))
    if settings.kubernetes_events:
        import importlib.util

        if importlib.util.find_spec("kubernetes") is None:
            raise UserError(
                "--kubernetes-events needs the kubernetes client, which this install lacks: "
                "pip install 'dflash-serve[kubernetes]' (for the image: make images "
                "SIDECAR_EXTRAS=kubernetes)"
            )
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise
    logging.getLogger("dflash_sidecar").info(
        "watching %s every %.1fs; serving on %s:%d",
        settings.engine_base,
        settings.scrape_interval,
        settings.host,
        settings.port,
    )
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level
    )
    return 0
