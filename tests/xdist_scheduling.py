"""How `make test` spreads pytest's first pass over pytest-xdist workers (`--engines-together`).

A test module is one unit of work (its module fixtures start once), except that the modules
sharing the session's local stack (tests/e2e/conftest.py `local_stack`: one real engine, its
sidecar and Prometheus) are one unit together, so the stack starts once, not once per worker.
Workers collect the engine tests first and the units keep the collection's order, so the long
units start first and the short ones fill in around them.

pytest-xdist's own `--dist loadgroup` cannot do this here: it renames each test's node id, which
pytest 9 no longer reads (the groups are silently ignored).
"""

from __future__ import annotations

import pytest
from xdist.scheduler.loadscope import LoadScopeScheduling

# Every module with a test that uses the `local_stack` fixture; tests/conftest.py fails the
# collection when one is missing here.
SHARED_STACK_MODULES = frozenset(
    {
        "tests/e2e/test_local_stack.py",
        "tests/e2e/test_prometheus_e2e.py",
        "tests/e2e/test_sidecar_image.py",
    }
)
SHARED_STACK_UNIT = "the session's local stack"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    module = module_of(nodeid)
    return SHARED_STACK_UNIT if module in SHARED_STACK_MODULES else module


def leaves_the_shared_stack(nextitem: pytest.Item | None) -> bool:
    """Whether a worker that just ran a test of the shared stack's unit is done with the stack:
    the unit's tests run together (one batch, in collection order), so the next test outside
    it (or none) means no test of this worker will use the stack again."""
    return nextitem is None or module_of(nextitem.nodeid) not in SHARED_STACK_MODULES


def check_shared_stack_modules(items: list[pytest.Item]) -> None:
    """A module that uses the local stack but is not listed would start a second stack."""
    unlisted = sorted(
        {
            module_of(item.nodeid)
            for item in items
            if "local_stack" in getattr(item, "fixturenames", ())
            and module_of(item.nodeid) not in SHARED_STACK_MODULES
        }
    )
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use the local_stack fixture: add them to "
            "SHARED_STACK_MODULES in tests/xdist_scheduling.py"
        )


def engines_first(items: list[pytest.Item]) -> None:
    """Collection order on a worker: the shared stack's modules, the other e2e modules, then
    the rest (a stable sort: within each, the order pytest collected)."""

    def rank(item: pytest.Item) -> int:
        if module_of(item.nodeid) in SHARED_STACK_MODULES:
            return 0
        return 1 if item.get_closest_marker("e2e") is not None else 2

    items.sort(key=rank)


class EnginesTogether(LoadScopeScheduling):
    """LoadScopeScheduling over `unit_of`, in collection order (not largest unit first)."""

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
