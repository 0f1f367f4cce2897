"""Sidecar settings, validated at start. One naming rule for every setting `name`:

    flag       --name-with-dashes         (dflash-serve sidecar --help lists them all)
    variable   DFLASH_SIDECAR_NAME        (flags win over variables)
    chart      sidecar.nameInCamelCase    (verdict thresholds: sidecar.thresholds.nameInCamelCase)

Durations are seconds. The verdict thresholds are settings too, named as in VerdictThresholds.
The engine's API key is the one exception: only the variable VLLM_API_KEY, the engine's own,
never a flag (a flag shows in the process list).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

from dflash_sidecar.baseline import Baseline, load_baseline, thresholds_from
from dflash_sidecar.schedule_form import Schedule
from dflash_sidecar.verdict import VerdictThresholds

DEFAULT_WINDOWS = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
WINDOW_PATTERN = r"^[0-9]+(\.[0-9]+)?[smh]$"  # the chart's sidecar-rules.yaml carries it too
WINDOW_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
ENV_PREFIX = "DFLASH_SIDECAR_"
# Field metadata: the unit --help shows.
SECONDS: JsonDict = {"unit": "s"}


class SidecarSettings(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)
    _baseline: Baseline | None = PrivateAttr(default=None)

    engine_url: AnyHttpUrl = Field(
        default=AnyHttpUrl("http://127.0.0.1:8000"),
        description="the vLLM engine's base URL (loopback: same pod)",
    )
    host: str = Field(default="0.0.0.0", description="listen address")
    port: int = Field(default=9100, ge=1, le=65535, description="listen port")
    scrape_interval: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="time between engine probes",
        json_schema_extra=SECONDS,
    )
    scrape_timeout: float = Field(
        default=1.5,
        gt=0,
        description="deadline of one engine probe, below twice scrape_interval",
        json_schema_extra=SECONDS,
    )
    windows: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_WINDOWS),
        description="window lengths, each a number and a unit s, m or h",
    )
    verdict_window: str = Field(
        default="5m", description="the window the verdict and its events follow (one of windows)"
    )
    canary_interval: float = Field(
        default=15.0,
        gt=0,
        description=(
            "an idle engine is asked for one token at most this often to prove it can generate; "
            "never while real traffic shows token progress"
        ),
        json_schema_extra=SECONDS,
    )
    canary_timeout: float = Field(
        default=20.0,
        gt=0,
        description="deadline of one canary completion",
        json_schema_extra=SECONDS,
    )
    stall_timeout: float = Field(
        default=120.0,
        gt=0,
        description="requests running with no token progress this long: not generating",
        json_schema_extra=SECONDS,
    )
    served_model: str | None = Field(
        default=None, description="model name for the canary (default: the first of /v1/models)"
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="the engine's API key (vLLM --api-key), sent as a bearer token on the "
        "routes vLLM guards (/v1/...)",
        json_schema_extra={"variable": "VLLM_API_KEY", "flag": False},
    )
    startup_budget: float = Field(
        default=3600.0,
        gt=0,
        description="an engine may load this long before it counts as failed to start",
        json_schema_extra=SECONDS,
    )
    engine_down_grace: float = Field(
        default=120.0,
        gt=0,
        description="/livez/engine fails once /health has failed this long after serving",
        json_schema_extra=SECONDS,
    )
    not_generating_grace: float = Field(
        default=600.0,
        gt=0,
        description="/livez/engine fails once /health answers without generation this long",
        json_schema_extra=SECONDS,
    )
    max_series: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="engine/model label sets tracked; a new one replaces one unseen for the "
        "longest window",
    )
    max_page_series: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="label sets read from one /metrics page; more are counted as dropped",
    )
    max_page_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=64 * 1024,
        le=256 * 1024 * 1024,
        description="a larger /metrics page is not read (counted as page_too_large)",
    )
    speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="the engine's k (num_speculative_tokens): figures implying more draft "
        "tokens per draft are withheld",
    )
    speculative_schedule: str | None = Field(
        default=None,
        description="the engine's k schedule as vLLM's JSON list ([[1, 4, 7], [5, 65536, 3]]; "
        "the chart passes speculative.schedule): what the schedule recommendation compares with",
    )
    events_timeout: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="deadline of one Kubernetes Event write (never holds the probes)",
        json_schema_extra=SECONDS,
    )
    thresholds: VerdictThresholds = Field(default_factory=VerdictThresholds)
    baseline_file: str | None = Field(
        default=None,
        description="the acceptance a healthy deployment showed on your traffic (a sweep's "
        "recommended-values.yaml with sidecar.baseline, or the baseline alone): the verdict "
        "thresholds become fractions of it (set no thresholds with it)",
    )
    kubernetes_events: bool = Field(
        default=False,
        description="emit Kubernetes Events on the pod when the verdict changes "
        "(needs pod_name and pod_namespace)",
    )
    pod_name: str | None = Field(default=None, description="this pod (downward API)")
    pod_namespace: str | None = Field(default=None, description="its namespace (downward API)")
    log_level: str = Field(
        default="info",
        pattern="^(debug|info|warning|error)$",
        description="debug, info, warning or error",
    )

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: dict[str, float]) -> dict[str, float]:
        if not value or any(seconds <= 0 for seconds in value.values()):
            raise ValueError("windows must be non-empty with positive lengths in seconds")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SidecarSettings:
        if self.scrape_timeout >= self.scrape_interval * 2:
            raise ValueError(
                f"scrape_timeout ({self.scrape_timeout:g}) must be below twice "
                f"scrape_interval ({self.scrape_interval:g})"
            )
        if self.verdict_window not in self.windows:
            raise ValueError(
                f"verdict_window {self.verdict_window!r} is not one of the windows "
                f"({', '.join(self.windows)})"
            )
        if min(self.windows.values()) < self.scrape_interval * 2:
            raise ValueError(
                f"every window must span at least two scrape intervals "
                f"(2 x {self.scrape_interval:g}s); the shortest is {min(self.windows.values()):g}s"
            )
        if self.speculative_schedule is not None:
            self.running_schedule()  # refused here, at start, when it is not one
        if self.kubernetes_events and not (self.pod_name and self.pod_namespace):
            raise ValueError(
                "kubernetes_events needs pod_name and pod_namespace "
                "(DFLASH_SIDECAR_POD_NAME / DFLASH_SIDECAR_POD_NAMESPACE from the downward API)"
            )
        if self.baseline_file is not None:
            return self._with_baseline(self.baseline_file)
        return self

    def running_schedule(self) -> Schedule | None:
        """speculative_schedule read: ranges of whole numbers from batch size 1, ascending, each
        k at most speculative_tokens."""
        if self.speculative_schedule is None:
            return None
        text = self.speculative_schedule
        try:
            ranges = tuple(tuple(int(v) for v in r) for r in json.loads(text))
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"speculative_schedule {text!r} is not vLLM's JSON list of [first, last, k] ({err})"
            ) from None
        largest = self.speculative_tokens
        if (
            not ranges
            or any(len(r) != 3 for r in ranges)
            or ranges[0][0] != 1
            or any(a[1] >= b[0] for a, b in itertools.pairwise(ranges))
            or any(r[2] < 0 or (largest is not None and r[2] > largest) for r in ranges)
        ):
            raise ValueError(
                f"speculative_schedule {text!r}: give ascending [first, last, k] ranges from "
                f"batch size 1 with k 0..speculative_tokens ({largest}), e.g. [[1, 4, 7], "
                "[5, 65536, 3]]"
            )
        return ranges  # type: ignore[return-value]

    def _with_baseline(self, path: str) -> SidecarSettings:
        """These settings with the thresholds the baseline in `path` gives."""
        # min_drafts stays a setting of its own; the four acceptance thresholds are the
        # baseline's to set.
        defaults = VerdictThresholds(min_drafts=self.thresholds.min_drafts)
        if self.thresholds != defaults:
            raise ValueError(
                "baseline_file and verdict thresholds both given: a baseline sets the acceptance "
                "thresholds (as fractions of it); drop one"
            )
        baseline = load_baseline(Path(path), self.served_model, self.speculative_tokens)
        judged = self.model_copy(
            update={"thresholds": thresholds_from(baseline, base=self.thresholds)}
        )
        judged._baseline = baseline
        return judged

    @property
    def baseline(self) -> Baseline | None:
        """The baseline in force (baseline_file's), if any."""
        return self._baseline

    @property
    def engine_base(self) -> str:
        return str(self.engine_url).rstrip("/")

    @property
    def window_capacity(self) -> int:
        """Snapshots kept per series: the longest window plus two intervals of slack."""
        return int(max(self.windows.values()) / self.scrape_interval) + 3


@dataclass(frozen=True)
class Setting:
    """One setting as users spell it: its flag, its variable, its unit and its default."""

    name: str
    field: FieldInfo
    threshold: bool  # lives in VerdictThresholds

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def variable(self) -> str:
        extra = self.field.json_schema_extra
        if isinstance(extra, dict) and "variable" in extra:
            return str(extra["variable"])
        return ENV_PREFIX + self.name.upper()

    @property
    def has_flag(self) -> bool:
        extra = self.field.json_schema_extra
        return not (isinstance(extra, dict) and extra.get("flag") is False)

    @property
    def chart_value(self) -> str:
        head, *rest = self.name.split("_")
        camel = head + "".join(word.title() for word in rest)
        return f"sidecar.thresholds.{camel}" if self.threshold else f"sidecar.{camel}"

    @property
    def unit(self) -> str | None:
        extra = self.field.json_schema_extra
        return str(extra["unit"]) if isinstance(extra, dict) and "unit" in extra else None

    @property
    def is_flag_only_switch(self) -> bool:
        return self.field.annotation is bool

    @property
    def metavar(self) -> str:
        if self.unit == "s":
            return "SECONDS"
        if self.field.annotation is int:
            return "N"
        return "X" if self.field.annotation is float else "TEXT"

    def default_text(self) -> str:
        if self.name == "windows":
            return ",".join(DEFAULT_WINDOWS)
        default = self.field.get_default(call_default_factory=True)
        return "none" if default is None else str(default)

    def help(self) -> str:
        unit = f"{self.unit}; " if self.unit else ""
        return (
            f"{self.field.description or ''} [{unit}default {self.default_text()}; {self.variable}]"
        )


def settings_spec() -> Iterator[Setting]:
    """Every setting, thresholds flattened, in the order --help lists them."""
    for name, field in SidecarSettings.model_fields.items():
        if name == "thresholds":
            for threshold, info in VerdictThresholds.model_fields.items():
                yield Setting(threshold, info, threshold=True)
        else:
            yield Setting(name, field, threshold=False)


def parse_windows(text: str) -> dict[str, float]:
    """`1m,5m,15m` -> {"1m": 60, ...}; units s, m, h."""
    windows: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not re.fullmatch(WINDOW_PATTERN, item, flags=re.ASCII):
            raise ValueError(f"window {item!r}: expected a number and a unit s, m or h (e.g. 5m)")
        windows[item] = float(item[:-1]) * WINDOW_UNITS[item[-1]]
    return windows


def number_limits(setting: Setting) -> dict[str, float | bool]:
    """A numeric setting's bounds as the sidecar checks them ({"gt": 0, "le": 60, ...}), and
    whether it must be an integer: what the chart's generated sidecar-rules.yaml carries."""
    limits: dict[str, float | bool] = {"integer": setting.field.annotation is int}
    for item in setting.field.metadata:
        for bound in ("gt", "ge", "lt", "le"):
            value = getattr(item, bound, None)
            if value is not None:
                limits[bound] = float(value)
    return limits


def _from_text(setting: Setting, raw: str) -> Any:
    if setting.name == "windows":
        return parse_windows(raw)
    if setting.field.annotation is bool:
        value = raw.strip().lower()
        if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"{setting.variable}={raw!r}: expected true or false")
        return value in ("1", "true", "yes", "on")
    return raw


def from_env(environ: dict[str, str], **overrides: object) -> SidecarSettings:
    """Settings from `DFLASH_SIDECAR_*` variables, then explicit overrides (flags, by name)."""
    spec = {s.variable: s for s in settings_spec()}
    values: dict[str, object] = {}
    thresholds: dict[str, object] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) and key not in spec:
            continue
        setting = spec.get(key)
        if setting is None:
            close = difflib.get_close_matches(key, spec, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(
                f"unknown setting {key}{hint} (dflash-serve sidecar --help lists them)"
            )
        (thresholds if setting.threshold else values)[setting.name] = _from_text(setting, raw)
    for name, value in overrides.items():
        if value is None:
            continue
        if name in VerdictThresholds.model_fields:
            thresholds[name] = value
        else:
            values[name] = value
    if thresholds:
        values["thresholds"] = thresholds
    return SidecarSettings.model_validate(values)
