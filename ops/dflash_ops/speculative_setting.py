"""One speculative setting: the method, k (num_speculative_tokens; with a schedule, the largest
k it drafts) and an optional k-by-batch-size schedule, with every rendering of it: the engine's
--speculative-config, the chart's `speculative` values and the `helm --set`s that apply them.
The planner, the local stack and the sweep build one and render from it; the schedule's text is
read once, where it enters (a flag, a values file, a sweep's state), by `ScheduleValue`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from dflash_ops.speculative_config import speculative_config_args
from dflash_ops.speculative_schedule import (
    Schedule,
    ScheduleError,
    check_schedule,
    parse_schedule,
    short_form,
)
from dflash_ops.vocabulary import MAX_K, SpeculativeMethod


def _schedule_value(value: object) -> object:
    """A schedule from the short form or vLLM's JSON as text, or vLLM's list of ranges; ""
    is none (a sweep's state before schedules were typed wrote "" for a static setting)."""
    if isinstance(value, str):
        return parse_schedule(value, MAX_K) if value.strip() else None
    if isinstance(value, list):
        return check_schedule(value, MAX_K)
    return value


def _schedule_text(schedule: Schedule | None) -> str | None:
    return None if schedule is None else short_form(schedule)


# A schedule in a pydantic model: read from text or a list once, written as its short form.
ScheduleValue = Annotated[
    Schedule | None,
    BeforeValidator(_schedule_value),
    PlainSerializer(_schedule_text, return_type=str | None),
]


def fits(schedule: Schedule, num_speculative_tokens: int) -> Schedule:
    """`schedule` if no range drafts more than the engine's num_speculative_tokens (vLLM would
    clamp it silently); else ScheduleError naming the range and the fix."""
    return check_schedule([list(entry) for entry in schedule], num_speculative_tokens,
                          short_form(schedule))  # fmt: skip


@total_ordering
@dataclass(frozen=True)
class SpeculativeSetting:
    """k = 0 is speculation off, whatever the method; a schedule needs k above 0 and drafts at
    most k at any batch size."""

    k: int
    method: SpeculativeMethod
    schedule: ScheduleValue = None

    def __post_init__(self) -> None:
        if not 0 <= self.k <= MAX_K:
            raise ValueError(f"k {self.k} is not 0 (off) to {MAX_K}")
        if self.schedule is not None:
            if not self.speculating:
                raise ScheduleError("a k schedule needs speculative decoding on")
            fits(self.schedule, self.k)

    @property
    def speculating(self) -> bool:
        return self.k > 0 and self.method != "off"

    @property
    def key(self) -> str:
        """The setting's name in a sweep (its point directory)."""
        if self.schedule is not None:
            return f"{self.method}-schedule"
        return f"{self.method}-k{self.k}" if self.speculating else "off"

    @property
    def schedule_text(self) -> str:
        """The schedule's short form, or "" without one."""
        return "" if self.schedule is None else short_form(self.schedule)

    @property
    def chart_method(self) -> str:
        """The chart's speculative.method (the CPU stand-in draft model stands for DFlash)."""
        if not self.speculating:
            return "off"
        return "dflash" if self.method == "draft_model" else self.method

    def _sort_key(self) -> tuple[int, str, str]:
        return (self.k, self.method, self.schedule_text)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SpeculativeSetting):
            return NotImplemented
        return self._sort_key() < other._sort_key()

    def engine_args(self, draft_model: str | None = None) -> list[str]:
        """`--speculative-config JSON`, or nothing when off (speculative_config's rule: method
        off or k 0)."""
        return speculative_config_args(self.method, self.k, draft_model, self.schedule)

    def chart_values(self, draft_model: str | None = None) -> dict[str, object]:
        """The chart's `speculative` values for this setting."""
        values: dict[str, object] = {"method": self.chart_method}
        if self.speculating:
            values["numSpeculativeTokens"] = self.k
        if draft_model:
            values["draftModel"] = draft_model
        if self.schedule is not None:
            values["schedule"] = self.schedule_text
        return values

    def helm_sets(self) -> list[str]:
        """`helm upgrade --reuse-values` arguments that apply this setting to a release: a
        static setting clears a schedule the release had; ';' separates the ranges, since
        --set splits on commas."""
        sets = ["--set", f"speculative.method={self.chart_method}"]
        if self.speculating:
            sets += ["--set", f"speculative.numSpeculativeTokens={self.k}"]
        return [*sets, "--set-string",
                f"speculative.schedule={self.schedule_text.replace(',', ';')}"]  # fmt: skip
