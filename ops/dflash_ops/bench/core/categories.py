"""Figures per prompt category (SpecBench's: writing, coding, math, translation, summarization,
rag...), where acceptance differs most: a draft that doubles the output rate on summaries may
barely pay on translation.

The engine's /metrics counters are one total for all requests, so per category the figure comes
from the stream: each streamed chunk is one engine step (vLLM sends a request's new tokens once
per step), so after the first token a request's tokens per chunk is the tokens it got per step:
1 + the draft tokens accepted, the mean acceptance length of that request. A server that splits
or merges chunks otherwise makes it a different figure: the results say it is from the stream."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, Field


class StreamedRequest(Protocol):
    """What the figures read of a request's record (client.RequestRecord)."""

    ok: bool
    category: str | None
    output_tokens: int
    chunk_times_s: list[float]

    @property
    def tpot_s(self) -> float | None: ...


class CategoryFigures(BaseModel):
    requests: int
    output_tokens: int
    steps: int = Field(description="streamed chunks after each request's first token")
    tokens_per_step: float | None = Field(
        description="output tokens after the first per streamed chunk after the first: the "
        "mean acceptance length as the stream shows it (null without a second chunk)"
    )
    tpot_ms_mean: float | None = None


def by_category(records: Iterable[StreamedRequest]) -> dict[str, CategoryFigures] | None:
    """The successful records' figures per category; None when no record has one."""
    grouped: dict[str, list[StreamedRequest]] = {}
    for record in records:
        if record.ok and record.category is not None:
            grouped.setdefault(record.category, []).append(record)
    if not grouped:
        return None
    figures = {}
    for category, members in sorted(grouped.items()):
        steps = sum(max(len(r.chunk_times_s) - 1, 0) for r in members)
        after_first = sum(max(r.output_tokens - 1, 0) for r in members)
        tpots = [t for r in members if (t := r.tpot_s) is not None]
        figures[category] = CategoryFigures(
            requests=len(members),
            output_tokens=sum(r.output_tokens for r in members),
            steps=steps,
            tokens_per_step=after_first / steps if steps else None,
            tpot_ms_mean=sum(tpots) / len(tpots) * 1000 if tpots else None,
        )
    return figures
