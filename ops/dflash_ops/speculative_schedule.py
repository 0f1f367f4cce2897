"""A k-by-batch-size schedule: vLLM 0.33.0's `num_speculative_tokens_per_batch_size`.

vLLM reads inclusive ranges of the running batch size, each with the k to draft at
(`[[1, 4, 7], [5, 16, 3], [17, 65536, 0]]`; vllm/v1/spec_decode/dynamic/utils.py): the first
range starts at 1, ranges do not overlap, a gap or the batch sizes past the last range keep the
k before them, each k is clamped to num_speculative_tokens (which stays the maximum the engine
sizes for) and k = 0 is plain decoding. Users may type the same as `1-4:7,5-16:3,17-:0`: an open
end runs to OPEN_END, and `;` or spaces separate ranges too (`helm --set` splits on commas).
A schedule is refused by name where vLLM would refuse it, and where it would silently clamp a k
above num_speculative_tokens; ranges are given in ascending order. The chart's
`dflash-serve.speculativeSchedule` applies the same rules.
"""

from __future__ import annotations

import json
import re

# The schedule's form and lookup live with the sidecar, which reads schedules too.
from dflash_sidecar.schedule_form import OPEN_END, Schedule, k_at, short_form

__all__ = ["OPEN_END", "Schedule", "ScheduleError", "k_at", "parse_schedule", "short_form"]

EXAMPLE = "1-4:7,5-16:3,17-:0"
_SHORT = re.compile(r"^(\d+)-(\d*):(\d+)$")


class ScheduleError(ValueError):
    """A schedule vLLM would refuse or misread; the message names the value and the fix."""


def parse_schedule(text: str, max_k: int) -> Schedule:
    """`text` in the short form or as vLLM's JSON list, checked against `max_k` (the engine's
    num_speculative_tokens)."""
    given = text.strip()
    if not given:
        raise ScheduleError(f"schedule is empty: give ranges of the batch size, e.g. {EXAMPLE}")
    if given.startswith(("[", "{")):
        try:
            loaded = json.loads(given)
        except json.JSONDecodeError:
            raise ScheduleError(
                f"schedule {given!r} is not a JSON list: use [[1, 4, 7], [5, 16, 3]] or {EXAMPLE}"
            ) from None
        return check_schedule(loaded, max_k, given)
    entries = []
    for part in re.split(r"[,;\s]+", given):
        match = _SHORT.match(part)
        if match is None:
            raise ScheduleError(
                f"schedule entry {part.strip()!r} is not FIRST-LAST:K (LAST may be left open), "
                f"e.g. {EXAMPLE}"
            )
        first, last, k = match.groups()
        entries.append([int(first), int(last) if last else OPEN_END, int(k)])
    return check_schedule(entries, max_k, given)


def check_schedule(entries: object, max_k: int, given: str | None = None) -> Schedule:
    """Entries as vLLM's JSON holds them, checked; `given` is how the user wrote them."""
    shown = given if given is not None else json.dumps(entries)
    if not isinstance(entries, list) or not entries:
        raise ScheduleError(
            f"schedule {shown!r} must be a non-empty list of ranges, e.g. {EXAMPLE}"
        )
    schedule: list[tuple[int, int, int]] = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
        ):
            raise ScheduleError(
                f"schedule {shown!r}: entry {json.dumps(entry)} is not [first, last, k] of whole "
                "numbers, e.g. [1, 4, 7]"
            )
        first, last, k = entry
        where = f"schedule {shown!r}: range {first}-{last}"
        if first < 1 or last < first:
            raise ScheduleError(f"{where} is empty or not positive: give FIRST <= LAST, from 1")
        if k < 0 or k > max_k:
            raise ScheduleError(
                f"{where} drafts {k}: k must be 0 (plain decoding) to num_speculative_tokens "
                f"{max_k}; raise num_speculative_tokens or lower this k"
            )
        if schedule and first <= schedule[-1][1]:
            previous = schedule[-1]
            raise ScheduleError(
                f"{where} starts at or before the end of {previous[0]}-{previous[1]}: give the "
                "ranges in ascending order, each batch size in one range"
            )
        schedule.append((first, last, k))
    if schedule[0][0] != 1:
        raise ScheduleError(
            f"schedule {shown!r} starts at batch size {schedule[0][0]}: the first range starts "
            "at 1, so every batch size has a k"
        )
    return tuple(schedule)
