from __future__ import annotations

import pytest
from dflash_sidecar.settings import from_env, parse_windows
from pydantic import ValidationError


def test_env_and_overrides() -> None:
    settings = from_env(
        {
            "DFLASH_SIDECAR_ENGINE_URL": "http://127.0.0.1:8001",
            "DFLASH_SIDECAR_WINDOWS": "30s,2m",
            "DFLASH_SIDECAR_MIN_DRAFTS": "5",
            "DFLASH_SIDECAR_VERDICT_WINDOW": "2m",
            "HOME": "/root",
        },
        port=9200,
    )
    assert settings.engine_base == "http://127.0.0.1:8001"
    assert settings.windows == {"30s": 30.0, "2m": 120.0}
    assert settings.thresholds.min_drafts == 5 and settings.port == 9200
    assert settings.window_capacity == 63


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DFLASH_SIDECAR_SCRAPE_INTERVAL": "-1"}, "greater than 0"),
        ({"DFLASH_SIDECAR_ENGINE_URL": "not a url"}, "URL"),
        ({"DFLASH_SIDECAR_VERDICT_WINDOW": "7m"}, "verdict_window '7m' is not one of the windows"),
        ({"DFLASH_SIDECAR_KUBERNETES_EVENTS": "true"}, "needs pod_name and pod_namespace"),
        ({"DFLASH_SIDECAR_SCRAPE_TIMEOUT": "10"}, "must be below twice"),
    ],
)
def test_bad_settings_name_the_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        from_env(env)


def test_unknown_variable_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown setting DFLASH_SIDECAR_SCRAPE_INTERVL"):
        from_env({"DFLASH_SIDECAR_SCRAPE_INTERVL": "2"})


def test_bad_window_text() -> None:
    with pytest.raises(ValueError, match="window '5x'"):
        parse_windows("1m,5x")


def test_an_old_variable_name_gets_the_new_one() -> None:
    with pytest.raises(ValueError, match="did you mean DFLASH_SIDECAR_SCRAPE_INTERVAL"):
        from_env({"DFLASH_SIDECAR_SCRAPE_INTERVAL_S": "2"})


def test_one_naming_rule_for_every_setting() -> None:
    from dflash_sidecar.settings import settings_spec

    names = {s.name for s in settings_spec()}
    assert {"scrape_interval", "collapsed_mean_acceptance_length", "log_level"} <= names
    for setting in settings_spec():
        assert setting.flag == "--" + setting.name.replace("_", "-")
        if setting.name == "api_key":  # the one exception: the engine's own variable, no flag
            assert setting.variable == "VLLM_API_KEY" and not setting.has_flag
            continue
        assert setting.variable == "DFLASH_SIDECAR_" + setting.name.upper()
        # every setting reads from its variable
        if setting.name in ("kubernetes_events", "pod_name", "pod_namespace", "windows"):
            continue
        default = setting.field.get_default(call_default_factory=True)
        if default is not None:
            assert from_env({setting.variable: str(default)}) is not None


def test_the_api_key_comes_from_the_engines_variable_and_never_shows() -> None:
    settings = from_env({"VLLM_API_KEY": "sk-hidden"})
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "sk-hidden"
    assert "sk-hidden" not in repr(settings) and "sk-hidden" not in settings.model_dump_json()


@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "Infinity"])
def test_numbers_must_be_finite(raw: str) -> None:
    with pytest.raises(ValueError):
        from_env({"DFLASH_SIDECAR_CANARY_INTERVAL": raw})


@pytest.mark.parametrize("raw", ["1m,5m", " 1m , 5m ,15m", "0.5h,90s"])
def test_windows_accepts_the_patterns_the_chart_checks(raw: str) -> None:
    assert from_env(
        {"DFLASH_SIDECAR_WINDOWS": raw, "DFLASH_SIDECAR_VERDICT_WINDOW": raw.split(",")[1].strip()}
    )


@pytest.mark.parametrize("raw", [".5m,5m", "1.m,5m", "\u0663m,5m", "5 m"])
def test_windows_refuses_what_the_chart_refuses(raw: str) -> None:
    with pytest.raises(ValueError):
        from_env({"DFLASH_SIDECAR_WINDOWS": raw})
