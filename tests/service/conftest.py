from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def before_text() -> str:
    return (FIXTURES / "vllm_cpu_before.prom").read_text()


@pytest.fixture(scope="session")
def after_text() -> str:
    return (FIXTURES / "vllm_cpu_after.prom").read_text()


def raw_counter(text: str, name: str, position: int | None = None) -> float:
    """A counter's value read straight from the exposition text (the oracle for the parser)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if position is not None and f'position="{position}"' not in line:
            continue
        return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the exposition")
