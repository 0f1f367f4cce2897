"""Sidecar settings: flags and `DFLASH_SIDECAR_*` environment variables, validated at start."""

from __future__ import annotations

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, field_validator, model_validator

from dflash_sidecar.verdict import VerdictThresholds

DEFAULT_WINDOWS = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
ENV_PREFIX = "DFLASH_SIDECAR_"


class SidecarSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    engine_url: AnyHttpUrl = Field(
        default=AnyHttpUrl("http://127.0.0.1:8000"), description="vLLM engine, on loopback"
    )
    host: str = "0.0.0.0"
    port: int = Field(default=9100, ge=1, le=65535)
    scrape_interval_s: float = Field(default=2.0, gt=0, le=60)
    scrape_timeout_s: float = Field(default=1.5, gt=0)
    windows: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_WINDOWS))
    canary_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "an idle engine is asked for one token at most this often to prove it can generate; "
            "never while real traffic shows token progress"
        ),
    )
    canary_timeout_s: float = Field(default=20.0, gt=0)
    stall_timeout_s: float = Field(
        default=120.0, gt=0, description="requests running with no token progress this long"
    )
    served_model: str | None = Field(default=None, description="model for the canary")
    startup_budget_s: float = Field(
        default=3600.0,
        gt=0,
        description="an engine may load this long before it counts as failed to start",
    )
    engine_down_grace_s: float = Field(
        default=120.0,
        gt=0,
        description="/livez/engine fails once /health has failed this long after serving",
    )
    not_generating_grace_s: float = Field(
        default=600.0,
        gt=0,
        description="/livez/engine fails once /health answers without generation this long",
    )
    max_series: int = Field(default=32, ge=1, description="engine/model label sets tracked")
    thresholds: VerdictThresholds = Field(default_factory=VerdictThresholds)
    verdict_window: str = "5m"
    kubernetes_events: bool = False
    pod_name: str | None = None
    pod_namespace: str | None = None

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: dict[str, float]) -> dict[str, float]:
        if not value or any(seconds <= 0 for seconds in value.values()):
            raise ValueError("windows must be non-empty with positive lengths in seconds")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SidecarSettings:
        if self.scrape_timeout_s >= self.scrape_interval_s * 2:
            raise ValueError(
                f"scrape_timeout_s ({self.scrape_timeout_s}) must be below twice "
                f"scrape_interval_s ({self.scrape_interval_s})"
            )
        if self.verdict_window not in self.windows:
            raise ValueError(
                f"verdict_window {self.verdict_window!r} is not one of the windows "
                f"({', '.join(self.windows)})"
            )
        if min(self.windows.values()) < self.scrape_interval_s * 2:
            raise ValueError("every window must span at least two scrape intervals")
        if self.kubernetes_events and not (self.pod_name and self.pod_namespace):
            raise ValueError(
                "kubernetes_events needs pod_name and pod_namespace "
                "(DFLASH_SIDECAR_POD_NAME / DFLASH_SIDECAR_POD_NAMESPACE from the downward API)"
            )
        return self

    @property
    def engine_base(self) -> str:
        return str(self.engine_url).rstrip("/")

    @property
    def window_capacity(self) -> int:
        """Snapshots kept per series: the longest window plus two intervals of slack."""
        return int(max(self.windows.values()) / self.scrape_interval_s) + 3


def parse_windows(text: str) -> dict[str, float]:
    """`1m,5m,15m` -> {"1m": 60, ...}; units s, m, h."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    windows: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        number, unit = item[:-1], item[-1]
        if unit not in units or not number.replace(".", "", 1).isdigit():
            raise ValueError(f"window {item!r}: expected a number and a unit s, m or h (e.g. 5m)")
        windows[item] = float(number) * units[unit]
    return windows


def from_env(environ: dict[str, str], **overrides: object) -> SidecarSettings:
    """Settings from `DFLASH_SIDECAR_*` variables, then explicit overrides (CLI flags)."""
    values: dict[str, object] = {}
    thresholds: dict[str, str] = {}
    threshold_fields = set(VerdictThresholds.model_fields)
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in threshold_fields:
            thresholds[name] = raw
        elif name == "windows":
            values[name] = parse_windows(raw)
        elif name == "kubernetes_events":
            values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif name in SidecarSettings.model_fields:
            values[name] = raw
        else:
            raise ValueError(f"unknown setting {key}")
    if thresholds:
        values["thresholds"] = thresholds
    values.update({k: v for k, v in overrides.items() if v is not None})
    return SidecarSettings.model_validate(values)
