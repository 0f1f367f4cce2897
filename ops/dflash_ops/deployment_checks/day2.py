#!/usr/bin/env python3
"""Day-2 acceptance on a real GPU cluster: install, test, auth, drain, upgrade, rollback,
uninstall, as docs/day2.md describes them, checked and printed as one table.

    python -m dflash_ops.deployment_checks.day2 -n llm [--profile NAME] [-f values.yaml] \\
        [--set key=value ...] [--api-key-secret vllm-api-key] [--dry-run]

Needs helm, kubectl and a kubeconfig for a cluster that passes `dflash-serve preflight`, and the
images the values name. Steps, each a row of the table:

1. preflight with the same value arguments;
2. `helm install --wait --timeout` (the chart's rollout budget): Ready within it;
3. `helm test`;
4. auth (with --api-key-secret): /v1/models answers 401 without the key, 200 with it;
5. drain: a long stream while the serving pod is deleted (preStop, then SIGTERM): the stream
   finishes with all its tokens;
6. upgrade to another k: the pods are replaced and serve with the new k;
7. `helm rollback --wait`: back to the first k;
8. `helm uninstall`: the model-cache claim stays.

`--dry-run` prints every command without a cluster. Exit status 0 only if every step passes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dflash_ops.chart.helm import helm_binary, helm_template
from dflash_ops.chart.values import add_values_arguments, values_files
from dflash_ops.paths import CHART_DIR


@dataclass
class Step:
    name: str
    detail: str
    ok: bool | None  # None: not run


@dataclass
class Day2:
    release: str
    namespace: str
    value_args: list[str]
    api_key_secret: str | None
    dry_run: bool
    steps: list[Step] = field(default_factory=list)

    # -- plumbing ------------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        print("$ " + shlex.join(argv), file=sys.stderr, flush=True)
        if self.dry_run:
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def record(self, name: str, ok: bool | None, detail: str) -> bool:
        self.steps.append(Step(name, detail, ok))
        mark = {True: "ok", False: "FAIL", None: "-"}[ok]
        print(f"[{mark}] {name}: {detail}", file=sys.stderr, flush=True)
        return ok is not False

    def kubectl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(["kubectl", "-n", self.namespace, *args], timeout=timeout)

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run([helm_binary(), *args, "-n", self.namespace], timeout=timeout)

    @property
    def engine_pods(self) -> str:
        """Label selector of the pods that serve (the Ray head in that layout)."""
        return f"app.kubernetes.io/instance={self.release},dflash-serve.io/component=engine"

    @property
    def fullname(self) -> str:
        return self.release if "dflash-serve" in self.release else f"{self.release}-dflash-serve"

    def budget_seconds(self) -> int:
        """The Deployment's progressDeadlineSeconds: what --wait must allow a cold start."""
        import yaml

        files, sets = self._values()
        rendered = helm_template(files, sets, self.release, self.namespace)
        for doc in yaml.safe_load_all(rendered):
            if doc and doc["kind"] == "Deployment":
                return int(doc["spec"]["progressDeadlineSeconds"])
        return 3600 + 900

    def _values(self) -> tuple[list[Path], list[str]]:
        pairs = list(itertools.pairwise(self.value_args))
        files = [Path(v) for flag, v in pairs if flag == "-f"]
        sets = [v for flag, v in pairs if flag == "--set"]
        return files, sets

    def api_key(self) -> str | None:
        if not self.api_key_secret or self.dry_run:
            return None
        found = self.kubectl("get", "secret", self.api_key_secret, "-o", "jsonpath={.data.api-key}")
        return base64.b64decode(found.stdout).decode() if found.returncode == 0 else None

    @contextlib.contextmanager
    def port_forward(self) -> Iterator[str]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [
            "kubectl",
            "-n",
            self.namespace,
            "port-forward",
            f"svc/{self.fullname}",
            f"{port}:8000",
        ]
        print("$ " + shlex.join(argv), file=sys.stderr)
        if self.dry_run:
            yield f"http://127.0.0.1:{port}"
            return
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()

    def engine_k(self) -> str | None:
        found = self.kubectl("get", "pods", "-l", self.engine_pods, "-o", "json")
        if self.dry_run or found.returncode != 0:
            return None
        for pod in json.loads(found.stdout)["items"]:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            args = pod["spec"]["containers"][0].get("args", [])
            for arg in args:
                if arg.startswith('{"method"'):
                    return str(json.loads(arg)["num_speculative_tokens"])
        return None

    # -- the steps -----------------------------------------------------------------------------
    def preflight(self) -> bool:
        found = self.run(
            [sys.executable, "-m", "dflash_ops.cli", "preflight", "-n", self.namespace,
             "--release", self.release, *self.value_args]
        )  # fmt: skip
        ok = None if self.dry_run else found.returncode == 0
        return self.record("preflight", ok, found.stdout[-300:] or "dry run")

    def install(self, budget: int) -> bool:
        started = time.monotonic()
        found = self.helm(
            "install", self.release, str(CHART_DIR), *self.value_args, "--wait",
            "--timeout", f"{budget}s", timeout=budget + 120,
        )  # fmt: skip
        took = time.monotonic() - started
        ok = None if self.dry_run else found.returncode == 0
        return self.record("install --wait", ok, f"{took:.0f}s of {budget}s {found.stderr[-300:]}")

    def helm_test(self) -> bool:
        found = self.helm("test", self.release, "--logs", timeout=900)
        ok = None if self.dry_run else found.returncode == 0
        return self.record("helm test", ok, found.stdout[-300:] or "dry run")

    def auth(self, base: str) -> bool:
        if not self.api_key_secret:
            return self.record("auth", None, "no --api-key-secret: skipped")
        key = self.api_key()
        if self.dry_run or key is None:
            return self.record("auth", None if self.dry_run else False, "key not readable")
        without = http_status(base + "/v1/models", {})
        with_key = http_status(base + "/v1/models", {"Authorization": f"Bearer {key}"})
        ok = without == 401 and with_key == 200
        return self.record("auth", ok, f"/v1/models: {without} without the key, {with_key} with it")

    def drain(self, base: str) -> bool:
        if self.dry_run:
            self.kubectl(
                "delete", "pod", "-l", f"app.kubernetes.io/instance={self.release}", "--wait=false"
            )
            return self.record("drain mid-stream", None, "dry run")
        key = self.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        models = json.loads(urlopen(base + "/v1/models", headers).read())
        model = models["data"][0]["id"]
        body = {
            "model": model, "prompt": "Count:", "max_tokens": 2000, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        request = urllib.request.Request(
            base + "/v1/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json", **headers},
        )  # fmt: skip
        tokens, finish, deleted = 0, None, False
        try:
            with urllib.request.urlopen(request, timeout=900) as reply:
                for raw in reply:
                    line = raw.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    for choice in event.get("choices", []):
                        finish = choice.get("finish_reason") or finish
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    if not deleted:
                        self.kubectl(
                            "delete", "pod", "-l", self.engine_pods, "--wait=false",
                        )  # fmt: skip
                        deleted = True
        except OSError as err:
            return self.record("drain mid-stream", False, f"the stream was cut: {err}")
        ok = finish == "length" and tokens == 2000
        return self.record("drain mid-stream", ok, f"finish {finish}, {tokens}/2000 tokens")

    def upgrade(self, budget: int, k: int) -> bool:
        found = self.helm(
            "upgrade", self.release, str(CHART_DIR), "--reuse-values",
            "--set", f"speculative.numSpeculativeTokens={k}", "--wait", "--timeout", f"{budget}s",
            timeout=budget + 120,
        )  # fmt: skip
        now = self.engine_k()
        ok = None if self.dry_run else found.returncode == 0 and now == str(k)
        return self.record("upgrade to another k", ok, f"engine pods serve k={now}")

    def rollback(self, budget: int, k: str | None) -> bool:
        found = self.helm(
            "rollback", self.release, "1", "--wait", "--timeout", f"{budget}s", timeout=budget + 120
        )
        now = self.engine_k()
        ok = None if self.dry_run else found.returncode == 0 and now == k
        return self.record("rollback", ok, f"engine pods serve k={now} (first install: k={k})")

    def uninstall(self) -> bool:
        self.helm("uninstall", self.release, "--wait", timeout=900)
        found = self.kubectl(
            "get", "pvc", "-l", f"app.kubernetes.io/instance={self.release}", "-o", "name"
        )
        ok = None if self.dry_run else bool(found.stdout.strip())
        return self.record("uninstall keeps the model cache", ok, found.stdout.strip() or "dry run")


def http_status(url: str, headers: dict[str, str]) -> int | None:
    try:
        return int(urlopen(url, headers).status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def urlopen(url: str, headers: dict[str, str]) -> urllib.request.addinfourl:  # type: ignore[name-defined]
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_values_arguments(parser)
    parser.add_argument("--release", default="dflash")
    parser.add_argument("-n", "--namespace", default="llm")
    parser.add_argument("--api-key-secret", help="the Secret auth.apiKeySecret names (key api-key)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    value_args: list[str] = []
    for path in values_files(args):
        value_args += ["-f", str(path)]
    for item in args.sets:
        value_args += ["--set", item]
    if args.api_key_secret:
        value_args += ["--set", f"auth.apiKeySecret.name={args.api_key_secret}"]
    day2 = Day2(args.release, args.namespace, value_args, args.api_key_secret, args.dry_run)
    budget = day2.budget_seconds()
    ok = day2.preflight() and day2.install(budget)
    if ok:
        first_k = day2.engine_k()
        day2.helm_test()
        with day2.port_forward() as base:
            day2.auth(base)
        with day2.port_forward() as base:
            day2.drain(base)
        other_k = 5 if first_k != "5" else 6
        day2.upgrade(budget, other_k)
        day2.rollback(budget, first_k)
        day2.uninstall()
    print("\n| step | result | detail |\n|---|---|---|")
    for step in day2.steps:
        mark = {True: "ok", False: "FAIL", None: "not run"}[step.ok]
        print(f"| {step.name} | {mark} | {step.detail.strip()[:200]} |")
    if args.dry_run:
        return 0
    return 0 if all(step.ok is not False for step in day2.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
