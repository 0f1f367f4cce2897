from __future__ import annotations

import time

from dflash_sidecar.app import create_app
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.settings import SidecarSettings
from fastapi.testclient import TestClient

from tests.service.fake_engine import FakeEngine


def wait_for(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_endpoints(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    settings = SidecarSettings(
        scrape_interval_s=0.1,
        scrape_timeout_s=0.15,
        windows={"1m": 60.0, "5m": 300.0},
        verdict_window="1m",
    )
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        assert client.get("/livez").json() == {"status": "alive"}
        wait_for(lambda: client.get("/readyz").status_code == 200)
        assert client.get("/readyz").json()["ready"] is True
        engine.metrics = after_text
        wait_for(lambda: client.get("/stats").json()["windows"]["1m"]["drafts"] > 0)
        stats = client.get("/stats").json()
        assert set(stats["windows"]) == {"1m", "5m"}
        assert stats["windows"]["1m"]["mean_acceptance_length"] >= 1
        body = client.get("/metrics").text
        assert 'dflash_mean_acceptance_length{engine="0",model_name="tiny",window="1m"}' in body
        assert "dflash_engine_ready 1.0" in body
        engine.reachable = False
        wait_for(lambda: client.get("/readyz").status_code == 503)
        assert client.get("/readyz").json()["reason"].startswith("engine not healthy")
        assert 'dflash_scrape_errors_total{kind="connect"}' in client.get("/metrics").text
