"""The sidecar's FastAPI app: liveness, readiness, Prometheus metrics and JSON stats.

No engine input can make an endpoint answer 5xx: `/readyz` and `/livez/engine` answer 503 on
purpose (that is their answer), `/stats` and `/metrics` always answer with what can be computed.
Every endpoint serves what the last scrape computed (`/metrics` renders its page once per
scrape), so a flood of requests costs little and never starves the probe loop. No API docs
(`/docs`, `/redoc`, `/openapi.json`) on this port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.events import VerdictEvents
from dflash_sidecar.metrics import build_registry
from dflash_sidecar.models import EngineLiveness, Readiness, StatsResponse
from dflash_sidecar.recommendation import Recommendation
from dflash_sidecar.settings import SidecarSettings

log = logging.getLogger("dflash_sidecar")


def create_app(settings: SidecarSettings, monitor: EngineMonitor | None = None) -> FastAPI:
    """The app owns its monitor; the monitor's loop runs for the app's lifetime."""
    monitor = monitor or EngineMonitor(settings)
    if settings.kubernetes_events:
        assert settings.pod_name and settings.pod_namespace
        monitor.verdict_listeners.append(
            VerdictEvents(
                settings.pod_name, settings.pod_namespace, timeout=settings.events_timeout
            )
        )
    registry = build_registry(monitor)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(monitor.run_forever(), name="engine-monitor")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await monitor.aclose()

    app = FastAPI(
        title="dflash-serve sidecar",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.monitor = monitor
    app.state.settings = settings

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/livez/engine", response_model=EngineLiveness)
    async def engine_livez() -> JSONResponse:
        liveness = monitor.liveness()
        return JSONResponse(liveness.model_dump(), status_code=200 if liveness.alive else 503)

    @app.get("/readyz", response_model=Readiness)
    async def readyz() -> JSONResponse:
        readiness = monitor.readiness()
        return JSONResponse(readiness.model_dump(), status_code=200 if readiness.ready else 503)

    @app.get("/stats", response_model=StatsResponse)
    async def stats() -> StatsResponse:
        return monitor.stats()

    @app.get("/recommendation", response_model=Recommendation)
    async def recommendation(window: str | None = None) -> JSONResponse:
        """?window=NAME: over one of --windows instead of the longest."""
        if window is not None and window not in settings.windows:
            known = ", ".join(settings.windows)
            return JSONResponse(
                {"detail": f"window={window!r} is not one of the sidecar's windows: use {known}"},
                status_code=400,
            )
        return JSONResponse(monitor.recommendation(window=window).model_dump(mode="json"))

    app.state.metrics_page = (None, b"")  # (the scrape it renders, the page)

    @app.get("/metrics")
    async def metrics() -> Response:
        figures_at = monitor.figures().at
        rendered_at, body = app.state.metrics_page
        if rendered_at != figures_at:
            body = generate_latest(registry)
            app.state.metrics_page = (figures_at, body)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
