"""How a sweep brings an engine up with one speculative setting, and puts things back after.

- `LocalDeployer`: the local stack (vLLM CPU engine) in the sweep's own state directory and
  ports, restarted for each setting; never a stack the user already runs there.
- `HelmDeployer`: `helm upgrade --reuse-values --set ...` of an installed release for each
  setting, waiting for the rollout with the chart's own readiness (`--wait`), then benchmarking
  through a given base URL; the release's original values are saved first and restored at the
  end, on failure and on Ctrl-C. On a GPU cluster every setting costs a pod restart and a model
  load (minutes for this model).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

import yaml

from dflash_ops.errors import UserError
from dflash_ops.speculative_setting import SpeculativeSetting
from dflash_ops.vocabulary import (
    CHART_METHODS,
    LOCAL_METHODS,
    LocalModels,
    SpeculativeMethod,
    speculating,
)

# The methods each deployer sweeps besides off: what the local stack and the chart serve.
LOCAL_SWEEP_METHODS: tuple[SpeculativeMethod, ...] = speculating(LOCAL_METHODS)
HELM_SWEEP_METHODS: tuple[SpeculativeMethod, ...] = speculating(CHART_METHODS)
SWEEP_MARKER = "sweep-owned"


# One point of the sweep's method axis (k = 0 is speculation off; with a schedule, k is its
# largest k): the project's one speculative setting.
Setting = SpeculativeSetting


class Deployer(Protocol):
    def apply(self, setting: Setting) -> str:
        """Bring the engine up with `setting`; the base URL to benchmark once it is ready."""
        ...

    def finish(self) -> None:
        """Put back what the sweep changed (idempotent)."""
        ...

    def live_sidecar(self, setting: Setting) -> str | None:
        """The sidecar URL whose live predictions the sweep records for `setting`, if any."""
        ...


def say(message: str) -> None:
    print(f"==> sweep: {message}", file=sys.stderr, flush=True)


def wait_until_serving(base_url: str, timeout_s: float, headers: dict[str, str]) -> None:
    """/v1/models answers 200: the rollout is done and traffic reaches the new engine."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        request = urllib.request.Request(base_url + "/v1/models", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                if reply.status == 200:
                    return
                last = f"HTTP {reply.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except OSError as err:
            last = str(err)
        time.sleep(2)
    raise UserError(f"{base_url}/v1/models did not answer 200 within {timeout_s:g} s ({last})")


class LocalDeployer:
    def __init__(
        self,
        state_dir: Path,
        engine_port: int,
        sidecar_port: int,
        enforce_eager: bool = False,
        engine_timeout_s: float = 600.0,
        models: LocalModels = "tiny",
        sidecar: tuple[Path, Setting] | None = None,
    ) -> None:
        from dflash_ops import directory_lock
        from dflash_ops.local import stack

        self.state_dir = state_dir
        self.engine_port, self.sidecar_port = engine_port, sidecar_port
        self.enforce_eager, self.engine_timeout_s = enforce_eager, engine_timeout_s
        self.models = models
        # A baseline with a step cost and the setting whose sidecar gets it (live_predictions.py):
        # that sidecar predicts every k from its live figures, scraping every second.
        self.sidecar_baseline: Path | None = sidecar[0] if sidecar is not None else None
        self.watched: Setting | None = sidecar[1] if sidecar is not None else None
        # The sweep owns its stack directory for its whole run: a second sweep from the same
        # folder would stop this one's engines (its settings' `up` and `down` each take the
        # stack's own lock only while they work). Released by finish(), or when this exits.
        self._owner = contextlib.ExitStack()
        self._owner.enter_context(
            directory_lock.holding(state_dir, "run a sweep", directory_lock.OWNER_LOCK)
        )
        running = stack.load_state(state_dir)
        if running is not None and not (state_dir / SWEEP_MARKER).is_file():
            self._owner.close()
            raise UserError(
                f"a local stack this sweep did not start runs in {state_dir} "
                f"(see dflash-serve local status --state-dir {state_dir}); give the sweep its own "
                "--state-dir"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / SWEEP_MARKER).write_text("run by dflash-serve bench sweep\n")

    def apply(self, setting: Setting) -> str:
        from dflash_ops.local import stack

        stack.down(self.state_dir, quiet=True)
        method = setting.method if setting.speculating else "off"
        say(f"{setting.key}: starting the local stack in {self.state_dir}")
        from dflash_ops.bench.sweep.live_predictions import SCRAPE_INTERVAL_S

        watched = self.live_sidecar(setting) is not None
        config = stack.StackConfig(
            state_dir=self.state_dir,
            engine_port=self.engine_port,
            sidecar_port=self.sidecar_port,
            method=method,  # type: ignore[arg-type]
            models=self.models,
            num_speculative_tokens=max(1, setting.k),
            schedule=setting.schedule,
            prometheus=False,
            engine_timeout_s=self.engine_timeout_s,
            enforce_eager=self.enforce_eager,
            baseline=self.sidecar_baseline if watched else None,
            sidecar_scrape_interval=SCRAPE_INTERVAL_S if watched else None,
        )
        try:
            state = stack.up(config)
        except stack.StackInterrupted as stopped:
            # Ctrl-C or SIGTERM while the engine starts is the sweep's interruption like any
            # other: what was measured is kept, the same command resumes, and the exit status
            # names the signal (130, 143) as when a level is interrupted.
            from dflash_ops.bench.core.run_directory import BenchInterrupted

            raise BenchInterrupted(stopped.exit_status, []) from None
        return next(p.url for p in state.processes if p.name == "engine")

    def live_sidecar(self, setting: Setting) -> str | None:
        watched = setting == self.watched
        return f"http://127.0.0.1:{self.sidecar_port}" if watched else None

    def finish(self) -> None:
        from dflash_ops.local import stack

        try:
            stack.down(self.state_dir, quiet=True)
        finally:
            self._owner.close()


class HelmDeployer:
    def __init__(
        self,
        release: str,
        namespace: str,
        chart: str,
        base_url: str,
        out: Path,
        timeout_s: float,
        helm: str,
        api_key: str | None = None,
    ) -> None:
        self.release, self.namespace, self.chart = release, namespace, chart
        self.base_url, self.timeout_s, self.helm = base_url, timeout_s, helm
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Saved once: a resumed sweep must restore the values from before the first sweep.
        self.original = out / "helm-original-values.yaml"
        # A sweep that was stopped before it could restore left the release changed.
        self.changed = self.original.is_file()
        if not self.original.is_file():
            values = self._helm("get", "values", release, "--namespace", namespace, "-o", "yaml")
            parsed = yaml.safe_load(values) or {}
            if not isinstance(parsed, dict):
                raise UserError(
                    f"helm get values {release} did not print a mapping: {values[:200]!r}"
                )
            self.original.write_text(yaml.safe_dump(parsed, sort_keys=False))

    def _helm(self, *args: str) -> str:
        try:
            done = subprocess.run(
                [self.helm, *args], capture_output=True, text=True, timeout=self.timeout_s + 60
            )
        except FileNotFoundError:
            raise UserError(f"helm not found at {self.helm}: install helm 3.x or 4.x") from None
        except subprocess.TimeoutExpired:
            raise UserError(
                f"helm {args[0]} {self.release} took over {self.timeout_s:g} s"
            ) from None
        if done.returncode != 0:
            raise UserError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()[-600:]}")
        return done.stdout

    def upgrade_args(self, setting: Setting) -> list[str]:
        args = ["upgrade", self.release, self.chart, "--namespace", self.namespace]
        args += ["--reuse-values", *setting.helm_sets(), "--set", "engine.blockSize=auto"]
        return [*args, "--wait", "--timeout", f"{int(self.timeout_s)}s"]

    def restore_args(self) -> list[str]:
        return [
            "upgrade", self.release, self.chart, "--namespace", self.namespace, "--reset-values",
            "--values", str(self.original), "--wait", "--timeout", f"{int(self.timeout_s)}s",
        ]  # fmt: skip

    def apply(self, setting: Setting) -> str:
        say(f"{setting.key}: helm upgrade {self.release} (a rollout and a model load)")
        self.changed = True
        self._helm(*self.upgrade_args(setting))
        wait_until_serving(self.base_url, self.timeout_s, self.headers)
        return self.base_url

    def finish(self) -> None:
        if not self.changed:
            return
        say(f"restoring the values {self.release} had before the sweep ({self.original})")
        self._helm(*self.restore_args())
        self.changed = False

    def live_sidecar(self, setting: Setting) -> str | None:
        return None  # the release's sidecars sit behind its door: not read by the sweep
