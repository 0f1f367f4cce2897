"""`dflash-serve local up|down|status`: the whole stack on one CPU machine."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from dflash_ops.cli.config_flags import add_config_flags, config_from_flags, flagged_fields
from dflash_ops.errors import UserError

# StackConfig's fields local up does not take as flags of their own: --state-dir is every
# action's, and the door is on when a key is given (--auth and the key flags below).
CLI_OWNED = ("state_dir", "auth")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "local",
        help="run the local stack: tiny model, vLLM CPU engine, sidecar, Prometheus",
        description=(
            "Build a tiny target and a perturbed draft on the fly (no download), start a real "
            "vLLM CPU engine with speculative decoding, the sidecar, and Prometheus if it is "
            "installed; with --replicas N, N engines with a sidecar each behind vLLM's router. "
            "State and logs live in --state-dir."
        ),
    )
    actions = parser.add_subparsers(dest="local_action", metavar="ACTION", required=True)
    up = actions.add_parser(
        "up",
        help="start the stack (no duplicates) and wait until ready",
        description="Start the stack (what already runs with this configuration is kept) and "
        "wait until every part is ready. Ctrl-C, SIGTERM or SIGHUP while it starts stops what "
        "was started and exits 128 + the signal's number (130 for Ctrl-C); a mistake in the "
        "arguments exits 2.",
    )
    from dflash_ops.local.stack_config import StackConfig

    add_config_flags(up, StackConfig, skip=CLI_OWNED)
    up.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; stop everything on Ctrl-C or SIGTERM (for containers)",
    )
    key = up.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="require the key in FILE (- for standard input; Authorization: Bearer KEY) "
        "through the chart's door, nginx in front of every engine and the router",
    )
    key.add_argument(
        "--api-key",
        metavar="KEY",
        help="as --api-key-file, the key itself: every local user sees it on the command "
        "line (ps); prefer --api-key-file, or $VLLM_API_KEY with --auth",
    )
    up.add_argument(
        "--auth",
        action="store_true",
        help="the door with the key of --api-key-file, $VLLM_API_KEY, or the running stack's; "
        "no process of the stack inherits VLLM_API_KEY or any other *_API_KEY variable",
    )
    rotate = actions.add_parser(
        "rotate-key",
        help="change the running stack's API key without an outage (two steps)",
        description="Step 1, `rotate-key --key-file FILE` (- for standard input): the doors "
        "accept the new key beside the current one. Move the clients to it, then step 2, "
        "`rotate-key --finish`: the new key is the only one. Nothing restarts; a request in "
        "flight is never refused.",
    )
    rotate.add_argument(
        "new_key",
        nargs="?",
        metavar="NEW",
        help="the key to accept as well, on the command line (every local user sees it there: "
        "prefer --key-file)",
    )
    rotate.add_argument(
        "--key-file", metavar="FILE", help="the key to accept as well, from FILE (- for stdin)"
    )
    rotate.add_argument("--finish", action="store_true", help="make the new key the only one")
    down = actions.add_parser("down", help="stop everything the stack started")
    status = actions.add_parser("status", help="what runs where")
    status.add_argument("--format", choices=["text", "json"], default="text")
    for sub in (up, down, status, rotate):
        sub.add_argument("--state-dir", type=Path, default=Path(".local-stack"))
    parser.set_defaults(handler=run)


def _say_visible(given: str, instead: str) -> None:
    from dflash_ops.local.supervisor import say

    say(f"{given}: the key is on this command line, where every local user can read it (ps); "
        f"use {instead}")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from dflash_ops.local import known_stacks, stack

    if args.local_action == "rotate-key":
        from dflash_ops.local import keys

        given = [args.new_key is not None, args.key_file is not None, args.finish]
        if sum(given) != 1:
            raise UserError(
                "local rotate-key: give --key-file FILE (or NEW) for step 1, or --finish for step 2"
            )
        new_key = args.new_key
        if args.key_file is not None:
            new_key = keys.read_key(args.key_file, "--key-file")
        elif new_key is not None:
            _say_visible("NEW", "--key-file FILE")
        print(stack.rotate_key(args.state_dir, new_key))
        return 0
    if args.local_action == "up":
        from dflash_ops.local import keys

        api_key = args.api_key
        if api_key is not None:
            _say_visible("--api-key", "--api-key-file FILE, or $VLLM_API_KEY with --auth")
        elif args.api_key_file is not None:
            api_key = keys.read_key(args.api_key_file, "--api-key-file")
        elif args.auth:
            api_key = os.environ.get("VLLM_API_KEY") or None
        auth = args.auth or api_key is not None
        config = config_from_flags(
            stack.StackConfig, args, flagged_fields(stack.StackConfig, CLI_OWNED), "local up",
            state_dir=args.state_dir,
            auth=auth,
            # The tiny pair's default written out, as every earlier state recorded it.
            draft_noise=(
                0.05 if args.draft_noise is None and args.models == "tiny" else args.draft_noise
            ),
        )  # fmt: skip
        state = stack.up(config, api_key, exits_when_interrupted=True)
        for record in state.processes:
            print(f"{record.name:<13} {record.url:<26} pid {record.pid:<7} log {record.log}")
        if args.foreground:
            stack.wait_in_foreground(state)
        return 0
    if args.local_action == "down":
        stack.down(args.state_dir)
        return 0
    rows = stack.status(args.state_dir)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"the local stack is not running in {args.state_dir.resolve()}")
        for other in known_stacks.running_elsewhere(args.state_dir):
            print(f"a stack runs in {other}: dflash-serve local status --state-dir {other}")
    else:
        for row in rows:
            health = (
                "healthy"
                if row["healthy"]
                else "running"
                if row["running"]
                else "leftover"
                if row["leftover_processes"]
                else "stopped"
            )
            print(f"{row['name']:<11} {health:<8} {row['url']:<26} pid {row['pid']}")
    return 0 if rows and all(r["healthy"] for r in rows) else 1
