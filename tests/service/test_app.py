from __future__ import annotations

import time

from dflash_sidecar.app import create_app
from dflash_sidecar.engine_monitor import EngineMonitor
from dflash_sidecar.settings import SidecarSettings
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.service.fake_engine import FakeEngine


def wait_for(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def fast_settings(**overrides: object) -> SidecarSettings:
    values: dict[str, object] = {
        "scrape_interval": 0.1,
        "scrape_timeout": 0.15,
        "windows": {"1m": 60.0, "5m": 300.0},
        "verdict_window": "1m",
    }
    values.update(overrides)
    return SidecarSettings.model_validate(values)


def test_endpoints(before_text: str, after_text: str) -> None:
    engine = FakeEngine(before_text)
    settings = fast_settings()
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        assert client.get("/livez").json() == {"status": "alive"}
        wait_for(lambda: client.get("/readyz").status_code == 200)
        assert client.get("/readyz").json()["ready"] is True
        assert client.get("/livez/engine").json()["state"] == "serving"
        engine.metrics = after_text
        wait_for(lambda: client.get("/stats").json()["windows"]["1m"]["drafts"] > 0)
        stats = client.get("/stats").json()
        assert set(stats["windows"]) == {"1m", "5m"} and stats["engine_state"] == "serving"
        assert stats["windows"]["1m"]["mean_acceptance_length"] >= 1
        body = client.get("/metrics").text
        assert 'dflash_mean_acceptance_length{engine="0",model_name="tiny",window="1m"}' in body
        assert "dflash_engine_ready 1.0" in body
        assert 'dflash_engine_state{state="serving"} 1.0' in body
        engine.reachable = False
        wait_for(lambda: client.get("/readyz").status_code == 503)
        assert client.get("/readyz").json()["reason"].startswith("engine down for")
        assert 'dflash_scrape_errors_total{kind="connect"}' in client.get("/metrics").text
        assert 'dflash_engine_state{state="down"} 1.0' in client.get("/metrics").text


def test_metrics_page_is_valid_exposition_in_every_state(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.reachable = False
    settings = fast_settings()
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        for make_state in (
            lambda: None,
            lambda: setattr(engine, "reachable", True),
            lambda: setattr(engine, "metrics", "garbage{"),
            lambda: setattr(engine, "health_status", 500),
        ):
            make_state()
            time.sleep(0.3)
            reply = client.get("/metrics")
            assert reply.status_code == 200
            names = {f.name for f in text_string_to_metric_families(reply.text)}
            assert {"dflash_engine_ready", "dflash_engine_up", "dflash_engine_state"} <= names


def test_engine_liveness_answers_503_only_after_the_grace(before_text: str) -> None:
    engine = FakeEngine(before_text)
    engine.completion_status = 500  # /health 200, engine core dead
    settings = fast_settings(canary_interval=0.1, not_generating_grace=0.5)
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        wait_for(lambda: client.get("/readyz").json()["state"] == "not_generating")
        assert client.get("/livez/engine").status_code == 200
        wait_for(lambda: client.get("/livez/engine").status_code == 503)
        assert "has not generated" in client.get("/livez/engine").json()["reason"]


def test_no_api_docs_on_the_metrics_port(before_text: str) -> None:
    engine = FakeEngine(before_text)
    settings = fast_settings()
    monitor = EngineMonitor(settings, client=engine.client())
    with TestClient(create_app(settings, monitor)) as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == 404, path
