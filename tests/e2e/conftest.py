"""A real local stack (vLLM CPU engine + sidecar [+ Prometheus]) shared by the e2e tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dflash_ops.local import stack
from dflash_ops.loopback import free_port


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


@pytest.fixture(scope="session")
def local_stack(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path
) -> Iterator[stack.StackState]:
    # A name vLLM would read as a DFlash draft if the stack passed the draft's absolute path.
    state_dir = tmp_path_factory.mktemp("dflash-serve-stack")
    (state_dir / "models").symlink_to(models_dir)
    state = stack.up(stack_config(state_dir))
    yield state
    stack.down(state_dir, quiet=True)


def start_engine_only(tmp_path: Path, models_dir: Path, **overrides: object) -> stack.StackState:
    """Another stack without Prometheus (for draft-quality and losslessness comparisons)."""
    (tmp_path / "models").symlink_to(models_dir)
    return stack.up(stack_config(tmp_path, prometheus=False, **overrides))
