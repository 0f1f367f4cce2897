"""A real local stack (vLLM CPU engine + sidecar [+ Prometheus]) shared by the e2e tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dflash_ops.local import stack
from dflash_ops.loopback import free_port

from tests import xdist_scheduling


def stack_config(state_dir: Path, **overrides: object) -> stack.StackConfig:
    values: dict[str, object] = {
        "state_dir": state_dir,
        "engine_port": free_port(),
        "sidecar_port": free_port(),
        "prometheus_port": free_port(),
        "num_speculative_tokens": 4,
        "draft_noise": 0.05,
        "engine_timeout_s": 900.0,
    }
    values.update(overrides)
    return stack.StackConfig.model_validate(values)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One set of tiny models for every stack in the session (built on first use)."""
    return tmp_path_factory.mktemp("models")


class SessionStack:
    """The session's local stack while it runs. With --engines-together its tests run one after
    another on one worker (tests/xdist_scheduling.py), which stops it once it moves on instead
    of at the end of its session: idle, the engine, the sidecar's canary and Prometheus keep
    8% of a core busy here, for what is half of `make test` on that worker."""

    state: stack.StackState | None = None
    stopped_early = False

    @classmethod
    def stop(cls) -> None:
        if cls.state is not None:
            stack.down(cls.state.config.state_dir, quiet=True)
            cls.state = None


@pytest.fixture(scope="session")
def local_stack(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path
) -> Iterator[stack.StackState]:
    # A name vLLM would read as a DFlash draft if the stack passed the draft's absolute path.
    state_dir = tmp_path_factory.mktemp("dflash-serve-stack")
    (state_dir / "models").symlink_to(models_dir)
    SessionStack.state = stack.up(stack_config(state_dir))
    yield SessionStack.state
    SessionStack.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if SessionStack.stopped_early and "local_stack" in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"{item.nodeid} uses the session's local stack, which this worker stopped after "
            "the tests of its unit (tests/xdist_scheduling.py) had run"
        )


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    config = item.config
    if SessionStack.state is None or not config.getoption("--engines-together"):
        return
    if not hasattr(config, "workerinput"):  # in one process the unit's modules are not together
        return
    if xdist_scheduling.leaves_the_shared_stack(nextitem):
        SessionStack.stop()
        SessionStack.stopped_early = True


def start_engine_only(tmp_path: Path, models_dir: Path, **overrides: object) -> stack.StackState:
    """Another stack without Prometheus (for draft-quality and losslessness comparisons)."""
    (tmp_path / "models").symlink_to(models_dir)
    return stack.up(stack_config(tmp_path, prometheus=False, **overrides))
