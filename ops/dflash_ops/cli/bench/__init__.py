"""`dflash-serve bench` and its subcommands: the benchmark run (run) is the `bench` command
itself; each subcommand below it lives in its own module, registered from this table in the
order `bench --help` lists them. The flags they share are in `flags`."""

from __future__ import annotations

from typing import Any

from dflash_ops.cli.bench import (
    client_ceiling,
    compare,
    job,
    lossless_power,
    router_policies,
    run,
    search,
    sidecar_cost,
    step_cost,
    sweep,
)

SUBCOMMANDS = (
    search.register,
    compare.register,
    job.register,
    sweep.register,
    step_cost.register,
    router_policies.register,
    sidecar_cost.register,
    client_ceiling.register,
    lossless_power.register,
)


def register(subparsers: Any) -> None:
    parser = run.register(subparsers)
    actions = parser.add_subparsers(dest="bench_action")
    for register_subcommand in SUBCOMMANDS:
        register_subcommand(actions)
