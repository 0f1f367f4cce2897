"""Patch 0004 under vLLM 0.33.0's async scheduling: the randomized invariant harness of
`kv_cache_harness`, driven the way `EngineCore.step_with_batch_queue` drives the scheduler when
async scheduling is on (the default for dflash, draft_model and dspark on Model Runner V1).

The order, read from the 0.33.0 wheel (brief section 10): the engine schedules step N+1 and hands
it to the worker before it waits for step N; then it handles the aborts that arrived meanwhile,
then `update_from_output(N)`. vLLM's real `AsyncScheduler` counts step N's tokens as computed
(and its drafts as output placeholders) when it schedules N+1, so N+1 is scheduled before anyone
knows how many of N's drafts were accepted; `allocate_slots` caches full blocks of known tokens at
schedule time (before the step that writes them has run), `update_from_output` caches up to what
is computed and not in flight, and rejections roll the counters back. Requests finished or
preempted while a step for them is in flight are still executed by the worker.

The worker here executes the steps in order, each with the block tables the scheduler gave it at
schedule time (a snapshot: later frees and re-allocations do not change what an in-flight step
writes): new blocks zeroed, then the copy-on-write copies, then the forward pass at the worker's
own positions (corrected for the previous step's rejected drafts), writing draft tokens' KV too;
then it samples: each draft position is accepted with a chance, up to the first rejection, plus a
bonus token. Every read is checked as in `kv_cache_harness` (each slot a query attends to holds the
signature of the reader's own prefix, drafts included), the block pool's books after every
update, and the model itself: after update N the scheduler's computed tokens and token ids equal
what the worker committed for N.

Injected: bursts of admissions, aborts both before schedule N+1 and between schedule N+1 and
update N (each followed at once by a retry of the same prompt, half the time), a prefix-cache
reset that preempts every running request with its output in flight (vLLM's drop-stale path),
preemptions from small pools, rejected drafts, and copies whose source a step still in flight
publishes (a retry or a sibling hitting a prompt whose blocks were cached when its first chunk was
scheduled).

The speculative config is vLLM's `ngram` method with k drafts (no draft model to load; the
scheduler treats it as it treats dflash: no eagle block drop), with DFlash's k + 1 lookahead
slots reserved.

Run against a tree with `PYTHONPATH=<tree>:<repo>`; long runs:
`python -m tests.patches.kv_cache_pipeline --geometry production --seeds 0-999`.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.patches.kv_cache_harness import (
    GEOMETRIES,
    Geometry,
    InvariantViolation,
    ShadowWorker,
    Workload,
    _next_prompt,
    attention_groups,
    build,
    check_books,
    check_drained,
    count_scheduled,
    held_kv,
    new_request,
    prompt_families,
)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# Defects planted in the worker to show the harness catches them: "copies-first" runs a step's
# copy-on-write copies before the previous step's forward pass has written their sources (as a
# worker that did not order the copy stream after the previous step would).
PLANTED = ("copies-first",)


@dataclass(frozen=True)
class PipelineWorkload(Workload):
    spec_tokens: int = 3  # k: drafts per decode step
    accept: float = 0.6  # each draft position is accepted with this chance, until one is not
    abort_in_flight_rate: float = 0.03  # aborts between schedule N+1 and update N
    retry_rate: float = 0.5  # an aborted request's prompt is sent again at once
    reset_rate: float = 0.004  # prefix-cache resets with requests running


@dataclass
class PipelineReport:
    seed: int
    geometry: dict[str, Any]
    planted: str | None = None
    requests: int = 0
    steps: int = 0
    hit_tokens: int = 0
    sub_block_hits: int = 0
    copies: int = 0
    in_flight_copy_sources: int = 0  # copies whose source block a step in flight writes
    preemptions: int = 0
    aborts_in_flight: int = 0
    retries: int = 0
    resets: int = 0
    drafts: int = 0
    rejected: int = 0
    stale_outputs: int = 0  # outputs the scheduler got for requests finished or preempted
    failure: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Span:
    """One request's part of a scheduled step, as the worker receives it."""

    tables: list[list[int | None]]  # per attention group, block ids (None: the null block)
    scheduled: int
    drafts: int
    fresh_tokens: list[int] | None  # new or resumed: the tokens it (re)starts from
    start: int  # the scheduler's first position: the worker's for a new or resumed request


@dataclass
class Plan:
    step: int
    spans: dict[str, Span]
    copies: list[Any]  # vLLM's KVCacheBlockCopy: src_block_id -> dst_block_id
    zero: list[int]


class PipelineWorker(ShadowWorker):
    """The worker's KV cache (ShadowWorker's shadow of every slot of the attention groups, and
    its copies) and its own view of each request: the tokens it knows and the positions whose
    KV it committed."""

    def __init__(
        self, managers: list[Any], groups: list[int], rng: random.Random, accept: float
    ) -> None:
        super().__init__(managers, groups)
        self.rng, self.accept = rng, accept
        self.tokens: dict[str, list[int]] = {}
        self.committed: dict[str, int] = {}
        self.incarnation: dict[str, int] = {}
        # Blocks each executed-or-queued step writes: copy sources a step in flight publishes.
        self.pending_writes: set[int] = set()
        self.drafted = self.rejected = 0

    def plan(self, output: Any, scheduler: Any, step: int) -> Plan:
        """What schedule `step` hands to the worker, with the block tables of this moment."""
        restarting = {new.req_id for new in output.scheduled_new_reqs}
        restarting |= set(output.scheduled_cached_reqs.resumed_req_ids)
        spans = {}
        for rid, scheduled in output.num_scheduled_tokens.items():
            request = scheduler.requests[rid]
            tables = [
                [None if b.is_null else b.block_id for b in self.managers[g].req_to_blocks[rid]]
                for g in self.groups
            ]
            spans[rid] = Span(
                tables=tables,
                scheduled=scheduled,
                drafts=len(output.scheduled_spec_decode_tokens.get(rid, ())),
                fresh_tokens=list(request.all_token_ids) if rid in restarting else None,
                start=request.num_computed_tokens - scheduled,
            )
        copies = list(output.kv_cache_block_copies or [])
        return Plan(step, spans, copies, list(output.new_block_ids_to_zero or []))

    def zero_and_copy(self, plan: Plan) -> None:
        """The start of a step's execution: new blocks zeroed, then its copies."""
        for g in self.groups:
            for block in plan.zero:
                for o in range(self.managers[g].block_size):
                    self.slots[g].pop((block, o), None)
                    self.writers[g].pop((block, o), None)
        self.copy(plan.copies)

    def forward(self, plan: Plan) -> tuple[Any, dict[str, tuple[int, int]]]:
        """Writes, then reads, then sampling; the model runner output and, per request, what it
        committed (positions with its own KV, tokens known)."""
        from vllm.v1.outputs import ModelRunnerOutput

        step = plan.step
        work: dict[str, tuple[int, int, list[int], list[int]]] = {}
        for rid, span in plan.spans.items():
            if span.fresh_tokens is not None:
                self.tokens[rid] = list(span.fresh_tokens)
                self.committed[rid] = span.start
                self.incarnation[rid] = self.incarnation.get(rid, -1) + 1
            start = self.committed[rid]
            if start > span.start:
                raise InvariantViolation(
                    f"model: step {step}: {rid} starts at {start}, after the scheduler's "
                    f"{span.start}"
                )
            tokens = self.tokens[rid]
            real = span.scheduled - span.drafts
            if start + real > len(tokens):
                raise InvariantViolation(
                    f"model: step {step}: {rid} is scheduled {real} tokens from {start} but "
                    f"the worker knows {len(tokens)}"
                )
            drafts = [self.rng.randrange(100, 60000) for _ in range(span.drafts)]
            work[rid] = (start, real, tokens, drafts)
        expected: dict[str, list[bytes]] = {}
        for rid, (start, real, tokens, drafts) in work.items():
            key = f"{rid}#{self.incarnation[rid]}"
            chain = [self.signatures.at(key, tokens, p) for p in range(start + real)]
            for token in drafts:
                chain.append(_extend(chain[-1] if chain else b"", token))
            expected[rid] = chain
            span = plan.spans[rid]
            for g, table in zip(self.groups, span.tables, strict=True):
                size = self.managers[g].block_size
                for p in range(start, start + span.scheduled):
                    block = table[p // size] if p // size < len(table) else None
                    if block is None:
                        raise InvariantViolation(
                            f"step {step}: {rid} writes position {p} of group {g} to the null "
                            "block or past its table"
                        )
                    self.slots[g][(block, p % size)] = chain[p]
                    self.writers[g][(block, p % size)] = (rid, p, step, "forward")
        for rid, (start, _, _, _) in work.items():
            span, chain = plan.spans[rid], expected[rid]
            end = start + span.scheduled
            for g, table in zip(self.groups, span.tables, strict=True):
                manager = self.managers[g]
                size = manager.block_size
                window = getattr(manager, "sliding_window", None)
                first = 0 if window is None else max(0, start - window + 1)
                for p in range(first, end):
                    block = table[p // size]
                    held = None if block is None else self.slots[g].get((block, p % size))
                    if held != chain[p]:
                        what = held_kv(block is None, held)
                        raise InvariantViolation(
                            f"step {step}: {rid} (positions {start}..{end - 1} at the worker, "
                            f"{span.start}.. at the scheduler) reads position {p} of group {g} "
                            f"({type(manager).__name__}) from block {block}, which holds {what} "
                            f"(last write: {self.writers[g].get((block, p % size))})"
                        )
        ids = list(plan.spans)
        sampled: list[list[int]] = []
        committed: dict[str, tuple[int, int]] = {}
        for rid in ids:
            start, real, tokens, drafts = work[rid]
            if start + real < len(tokens):  # a prefill chunk short of the prompt's end
                self.committed[rid] = start + real
                sampled.append([])
            else:
                accepted = 0
                while accepted < len(drafts) and self.rng.random() < self.accept:
                    accepted += 1
                self.drafted += len(drafts)
                self.rejected += len(drafts) - accepted
                new = [*drafts[:accepted], self.rng.randrange(100, 60000)]
                tokens.extend(new)
                self.committed[rid] = start + real + accepted
                sampled.append(new)
            committed[rid] = (self.committed[rid], len(tokens))
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        return output, committed


def _extend(previous: bytes, token: int) -> bytes:
    import hashlib

    data = previous + token.to_bytes(8, "little", signed=True)
    return hashlib.blake2b(data, digest_size=8).digest()


def build_async(geometry: Geometry, spec_tokens: int) -> tuple[Any, Any, int, int]:
    """`kv_cache_harness.build` with async scheduling and k drafts: vLLM's AsyncScheduler."""
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return build(
        geometry,
        scheduler_class=AsyncScheduler,
        speculative_config=SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=spec_tokens,
            prompt_lookup_max=4,
            prompt_lookup_min=1,
        ),
        lookahead_tokens=spec_tokens + 1,  # DFlash's: a bonus query plus one per draft
    )


def run(
    seed: int,
    geometry: Geometry | None = None,
    workload: PipelineWorkload | None = None,
    *,
    same_step_guard: bool = True,
    planted: str | None = None,
) -> PipelineReport:
    from vllm.v1.request import RequestStatus

    if planted is not None and planted not in PLANTED:
        raise ValueError(f"planted defect {planted!r}: one of {PLANTED}")
    logging.disable(logging.WARNING)
    geometry = geometry or Geometry()
    workload = workload or PipelineWorkload()
    scheduler, hasher, block_size, _ = build_async(geometry, workload.spec_tokens)
    managers, attention = attention_groups(scheduler, same_step_guard)
    rng = random.Random(seed)
    worker = PipelineWorker(managers, attention, random.Random(seed + 1), workload.accept)
    report = PipelineReport(seed=seed, geometry=asdict(geometry), planted=planted)
    families = prompt_families(rng, workload)
    sent: list[list[int]] = []

    def admit(prompt: list[int]) -> None:
        sent.append(prompt)
        scheduler.add_request(new_request(f"r{report.requests}", prompt, rng, workload, hasher))
        report.requests += 1

    def abort(rate: float) -> bool:
        if not scheduler.requests or rng.random() >= rate:
            return False
        victim = scheduler.requests[rng.choice(sorted(scheduler.requests))]
        prompt = list(victim.prompt_token_ids)
        scheduler.finish_requests(victim.request_id, RequestStatus.FINISHED_ABORTED)
        if rng.random() < workload.retry_rate:
            admit(prompt)
            report.retries += 1
        return True

    # Steps scheduled and not yet updated, oldest first: the engine's batch queue (size 2).
    queue: list[_Queued] = []
    step = 0
    try:
        for step in range(workload.steps + 10_000):
            admitting = step < workload.steps
            if admitting:  # the engine's input queue, before schedule N+1
                for _ in range(rng.choice(workload.burst)):
                    admit(_next_prompt(rng, families, sent, workload))
                abort(workload.abort_rate)
                if scheduler.running and rng.random() < workload.reset_rate:
                    scheduler.reset_prefix_cache(reset_running_requests=True)
                    report.resets += 1
            elif not scheduler.has_requests() and not queue:
                break
            scheduled = scheduler.has_requests()
            if scheduled:
                output = scheduler.schedule()
                count_scheduled(report, output, block_size)
                plan = worker.plan(output, scheduler, step)
                report.in_flight_copy_sources += sum(
                    c.src_block_id in worker.pending_writes for c in plan.copies
                )
                worker.pending_writes = _written_blocks(plan)
                # Execute N+1 starts with its zeroing and copies, after execute N (in order).
                worker.zero_and_copy(plan)
                queued = _Queued(output, plan)
                if planted == "copies-first":
                    for earlier in queue:  # the previous step's forward only now
                        if earlier.result is None:
                            earlier.result = worker.forward(earlier.plan)
                else:
                    queued.result = worker.forward(plan)
                queue.append(queued)
            if queue and (len(queue) == 2 or not scheduled):
                oldest = queue.pop(0)
                if oldest.result is None:
                    oldest.result = worker.forward(oldest.plan)
                if admitting and abort(workload.abort_in_flight_rate):
                    report.aborts_in_flight += 1
                _update(scheduler, oldest.output, *oldest.result, report, step)
                check_books(scheduler, step)
        else:
            raise InvariantViolation(f"the workload did not drain in {step} steps")
        check_drained(scheduler)
    except InvariantViolation as violation:
        report.failure = str(violation)
    report.steps = step + 1
    report.drafts, report.rejected = worker.drafted, worker.rejected
    return report


@dataclass
class _Queued:
    output: Any
    plan: Plan
    result: tuple[Any, dict[str, tuple[int, int]]] | None = None


def _written_blocks(plan: Plan) -> set[int]:
    blocks: set[int] = set()
    for span in plan.spans.values():
        for table in span.tables:
            blocks.update(b for b in table if b is not None)
    return blocks


def _update(
    scheduler: Any,
    output: Any,
    model_output: Any,
    committed: dict[str, tuple[int, int]],
    report: PipelineReport,
    step: int,
) -> None:
    """update_from_output(N), then the model check: a request still running got exactly what
    the worker committed for N (positions with its own KV, tokens)."""
    from vllm.v1.request import RequestStatus

    running_before = {
        rid: scheduler.requests[rid].status == RequestStatus.RUNNING
        and scheduler.requests[rid].num_stale_output_tokens == 0
        for rid in output.num_scheduled_tokens
        if rid in scheduler.requests
    }
    report.stale_outputs += len(output.num_scheduled_tokens) - sum(running_before.values())
    scheduler.update_from_output(output, model_output)
    for rid, was_running in running_before.items():
        request = scheduler.requests.get(rid)
        if not was_running or request is None or request.status != RequestStatus.RUNNING:
            continue
        positions, tokens = committed[rid]
        if request.num_computed_tokens - request.num_in_flight_tokens != positions or (
            request.num_tokens != tokens
        ):
            raise InvariantViolation(
                f"model: after update {step}: {rid} has {request.num_computed_tokens} computed "
                f"({request.num_in_flight_tokens} in flight) and {request.num_tokens} tokens; "
                f"the worker committed {positions} positions and {tokens} tokens"
            )


def sweep(
    geometry: str, seeds: list[int], *, same_step_guard: bool = True, planted: str | None = None
) -> list[dict[str, Any]]:
    layout, workload = GEOMETRIES[geometry]
    pipeline = PipelineWorkload(**asdict(workload))
    return [
        asdict(run(seed, layout, pipeline, same_step_guard=same_step_guard, planted=planted))
        for seed in seeds
    ]


def main() -> None:
    """Long runs: `PYTHONPATH=<tree>:. python -m tests.patches.kv_cache_pipeline --geometry
    production --seeds 0-999` prints each failing seed, then a summary per layout."""
    import argparse
    import sys
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), nargs="+", default=["small"])
    parser.add_argument("--seeds", default="0-49", help="LOW-HIGH, inclusive")
    parser.add_argument("--no-guard", action="store_true", help="switch the same-step guard off")
    parser.add_argument("--planted", choices=PLANTED, help="plant a defect in the worker")
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    seeds = list(range(int(low), int(high or low) + 1))
    failed = 0
    for name in args.geometry:
        started = time.monotonic()
        reports = sweep(name, seeds, same_step_guard=not args.no_guard, planted=args.planted)
        for report in reports:
            if report["failure"]:
                failed += 1
                print(f"{name} seed {report['seed']}: {report['failure']}", flush=True)
        totals = {
            key: sum(r[key] for r in reports)
            for key in ("steps", "copies", "in_flight_copy_sources", "preemptions", "retries",
                        "aborts_in_flight", "resets", "drafts", "stale_outputs", "sub_block_hits")
        }  # fmt: skip
        print(
            f"{name}: {len(seeds)} seeds, {sum(1 for r in reports if r['failure'])} failed, "
            f"{time.monotonic() - started:.0f}s; {totals}",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
