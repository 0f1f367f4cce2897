"""`dflash-serve local up|down|status`: the whole stack on one CPU machine."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from dflash_ops.cli.arguments import number
from dflash_ops.errors import UserError
from dflash_ops.vocabulary import LOCAL_METHODS, LOCAL_MODELS, MAX_K, STANDING_ROUTER_POLICIES


def _k(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_K:
        raise argparse.ArgumentTypeError(f"{value}: num_speculative_tokens must be 1 to {MAX_K}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: a port is 1 to 65535")
    return value


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
    up.add_argument("--method", choices=LOCAL_METHODS, default="draft_model")
    up.add_argument(
        "--k", type=_k, default=4, help=f"num_speculative_tokens, 1 to {MAX_K} (default 4)"
    )
    up.add_argument(
        "--schedule",
        metavar="RANGES",
        help="a k per running batch size, e.g. 1-2:4,3-:1 (k 4 for 1 to 2 running requests, 1 "
        "above) or vLLM's JSON [[1,2,4],[3,64,1]]; --k stays the largest k",
    )
    up.add_argument(
        "--models",
        choices=LOCAL_MODELS,
        default="tiny",
        help="the model pair, served under its name: tiny (starts fastest; its draft is the "
        "target plus noise, as costly as the target, so speculation never pays here) or "
        "paying (a ~180M bfloat16 target and a draft of its first 2 layers: speculation pays "
        "at low load, as on a GPU; start it with --enforce-eager) (tiny)",
    )
    up.add_argument(
        "--draft-noise",
        type=number(float, 0, 10),
        help="noise x each weight's std added to the draft: tiny pair, draft = target + noise "
        "(0: identical; default 0.05); paying pair, its own draft + noise (default none: 10 "
        "makes a draft that is noise, as a broken capture would)",
    )
    up.add_argument(
        "--engine-port",
        type=_port,
        default=8000,
        help="the OpenAI API: the engine's port, or the router's with --replicas > 1 (8000)",
    )
    up.add_argument(
        "--replicas",
        type=number(int, 1, 8),
        default=1,
        help="engines, a sidecar each; more than one: vLLM's router in front of them on "
        "--engine-port, the engines on --replica-base-port + i and the sidecars on "
        "--sidecar-port + i (1)",
    )
    up.add_argument("--replica-base-port", type=_port, default=8100)
    up.add_argument(
        "--router-policy",
        choices=STANDING_ROUTER_POLICIES,
        default="cache_aware",
        help="the router's policy with --replicas > 1 (cache_aware: by prefix)",
    )
    up.add_argument("--router-metrics-port", type=_port, default=29000)
    up.add_argument("--sidecar-port", type=_port, default=9100)
    up.add_argument("--prometheus-port", type=_port, default=9090)
    up.add_argument("--no-prometheus", action="store_true")
    up.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 in a container)")
    up.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached; stop everything on Ctrl-C or SIGTERM (for containers)",
    )
    up.add_argument(
        "--engine-timeout",
        type=number(float, 0, 24 * 3600, low_open=True),
        default=600.0,
        help="seconds the engine may take to start (default 600)",
    )
    up.add_argument(
        "--enforce-eager",
        action="store_true",
        help="vLLM without torch.compile: decodes about half as fast and starts about as fast "
        "(engine init 3 s against 4.5 s compiled, here)",
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
    up.add_argument(
        "--max-model-len",
        type=number(int, 256, 8192),
        default=2048,
        help="vLLM's --max-model-len, 256 to 8192 (the tiny model's positions)",
    )
    up.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="the acceptance a healthy deployment showed on your traffic: a bench results.json "
        "(of this pair at this k, sampled as your traffic is), a baseline file, or a "
        "recommended-values.yaml with sidecar.baseline; the sidecars' verdict and the collapse "
        "alert then judge against it instead of greedy constants",
    )
    up.add_argument(
        "--door-base-port",
        type=_port,
        default=8200,
        help="with a key: vLLM (and the router) listen here + i on loopback, behind the doors",
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
        from pydantic import ValidationError

        from dflash_ops.local import keys

        api_key = args.api_key
        if api_key is not None:
            _say_visible("--api-key", "--api-key-file FILE, or $VLLM_API_KEY with --auth")
        elif args.api_key_file is not None:
            api_key = keys.read_key(args.api_key_file, "--api-key-file")
        elif args.auth:
            api_key = os.environ.get("VLLM_API_KEY") or None
        auth = args.auth or api_key is not None
        try:
            config = stack.StackConfig(
                state_dir=args.state_dir,
                engine_port=args.engine_port,
                sidecar_port=args.sidecar_port,
                prometheus_port=args.prometheus_port,
                method=args.method,
                models=args.models,
                num_speculative_tokens=args.k,
                schedule=args.schedule,
                # The tiny pair's default written out, as every earlier state recorded it.
                draft_noise=(
                    0.05 if args.draft_noise is None and args.models == "tiny" else args.draft_noise
                ),
                prometheus=not args.no_prometheus,
                engine_timeout_s=args.engine_timeout,
                host=args.host,
                enforce_eager=args.enforce_eager,
                replicas=args.replicas,
                replica_base_port=args.replica_base_port,
                router_policy=args.router_policy,
                router_metrics_port=args.router_metrics_port,
                auth=auth,
                door_base_port=args.door_base_port,
                max_model_len=args.max_model_len,
                baseline=args.baseline,
            )
        except ValidationError as err:
            problem = err.errors()[0]
            where = f"{problem['loc'][0]}: " if problem["loc"] else ""
            message = str(problem["msg"]).removeprefix("Value error, ")
            raise UserError(f"local up: {where}{message}") from None
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
