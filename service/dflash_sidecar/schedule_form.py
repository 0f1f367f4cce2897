"""A k schedule's form: vLLM 0.33.0's `num_speculative_tokens_per_batch_size` as ranges of the
running batch size (first, last, k), its short form (`1-4:7,5-16:3,17-:0`) and the k it runs at a
batch size. The grammar that reads one, with its refusals, is dflash_ops.speculative_schedule.
"""

from __future__ import annotations

# The end of an open range (`17-:0`): far above any batch size an engine runs.
OPEN_END = 65536

Schedule = tuple[tuple[int, int, int], ...]


def short_form(schedule: Schedule) -> str:
    return ",".join(
        f"{first}-{'' if last == OPEN_END else last}:{k}" for first, last, k in schedule
    )


def k_at(schedule: Schedule, batch_size: int, max_k: int) -> int:
    """The k vLLM drafts at `batch_size` (gaps and the tail keep the k before them)."""
    k = schedule[0][2]
    for first, _, range_k in schedule:
        if first > batch_size:
            break
        k = range_k
    return min(k, max_k)
