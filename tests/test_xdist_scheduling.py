"""`make test`'s pass 1 on pytest-xdist workers (tests/xdist_scheduling.py): pytest-xdist's own
scheduler class fed a collection, with workers that run what they are sent."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests import xdist_scheduling
from tests.conftest import REPO_ROOT

STACK = sorted(xdist_scheduling.SHARED_STACK_MODULES)


@dataclass(eq=False)  # hashed by identity, as the scheduler keys its tables by worker
class Worker:
    """What the scheduler needs of pytest-xdist's WorkerController: a name and a queue."""

    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Worker:
        return self

    @property
    def id(self) -> str:
        return self.name

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def send_runtest_all(self) -> None:
        raise AssertionError("the scheduler sends work units, not everything")

    def shutdown(self) -> None:
        self.shutting_down = True


def run(collection: list[str], workers: int, seed: int) -> dict[str, list[str]]:
    """Schedule the collection over the workers, completing tests in a random interleaving
    until every test ran; returns what each worker ran, in order."""
    config = pytest.Config.fromdictargs({"tx": [f"{workers}*popen"]}, [])
    config.option.loadscopereorder = True  # pytest-xdist's default, which the class turns off
    scheduler = xdist_scheduling.EnginesTogether(config)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        scheduler.add_node_collection(node, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    done = {node.name: 0 for node in nodes}
    rng = random.Random(seed)
    while not scheduler.tests_finished:
        busy = [node for node in nodes if done[node.name] < len(node.sent)]
        assert busy, "tests left but no worker has any"
        node = rng.choice(busy)
        scheduler.mark_test_complete(node, node.sent[done[node.name]])  # type: ignore[arg-type]
        done[node.name] += 1
    return {node.name: [collection[i] for i in node.sent] for node in nodes}


def collection_of(modules: dict[str, int]) -> list[str]:
    return [f"{module}::test_{i}" for module, count in modules.items() for i in range(count)]


@pytest.mark.parametrize("seed", range(20))
def test_the_stack_modules_run_on_one_worker_and_every_module_stays_whole(seed: int) -> None:
    rng = random.Random(seed)
    others = {f"tests/e2e/test_other_{i}.py": rng.randint(1, 6) for i in range(4)}
    rest = {f"tests/ops/test_quick_{i}.py": rng.randint(1, 30) for i in range(12)}
    stack = {module: rng.randint(1, 12) for module in STACK}
    collection = collection_of({**stack, **others, **rest})
    ran = run(collection, workers=rng.choice([2, 3]), seed=seed)

    assert sorted(test for tests in ran.values() for test in tests) == sorted(collection)
    owner = {test: worker for worker, tests in ran.items() for test in tests}
    on = {module: {owner[t] for t in collection if t.startswith(module + "::")} for module in stack}
    assert len(set.union(*on.values())) == 1, on  # one worker, so one local stack
    for module in [*others, *rest]:
        assert len({owner[t] for t in collection if t.startswith(module + "::")}) == 1, module
    # The shared stack's unit is the first a worker gets: the longest unit starts first.
    stack_worker = next(iter(on[STACK[0]]))
    assert xdist_scheduling.module_of(ran[stack_worker][0]) in xdist_scheduling.SHARED_STACK_MODULES
    # ...and its tests run one after another, so the worker stops the stack after the last of
    # them (tests/e2e/conftest.py): no test of the unit comes after one from outside it.
    shared = [
        xdist_scheduling.module_of(t) in xdist_scheduling.SHARED_STACK_MODULES
        for t in ran[stack_worker]
    ]
    assert shared == sorted(shared, reverse=True), ran[stack_worker]


def test_the_suites_modules_that_use_the_local_stack_are_all_listed() -> None:
    """The collection check, on the real suite: no module would start a stack of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--engines-together",
         "-p", "no:cacheprovider", "tests/e2e", "tests/docker"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str]


def test_an_unlisted_module_using_the_stack_is_named_with_the_fix() -> None:
    items = [
        Item("tests/e2e/test_local_stack.py::test_a", ["local_stack"]),
        Item("tests/e2e/test_new.py::test_b", ["tmp_path", "local_stack"]),
        Item("tests/e2e/test_other.py::test_c", ["models_dir"]),
    ]
    with pytest.raises(pytest.UsageError) as raised:
        xdist_scheduling.check_shared_stack_modules(items)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "tests/e2e/test_new.py use the local_stack fixture: add them to "
        "SHARED_STACK_MODULES in tests/xdist_scheduling.py"
    )
    xdist_scheduling.check_shared_stack_modules(items[::2])  # type: ignore[arg-type]


def test_a_worker_leaves_the_shared_stack_at_the_first_test_outside_its_unit() -> None:
    def item(nodeid: str) -> pytest.Item:
        return Item(nodeid, [])  # type: ignore[return-value]

    leaves = xdist_scheduling.leaves_the_shared_stack
    assert not leaves(item(f"{STACK[0]}::test_a"))
    assert not leaves(item(f"{STACK[-1]}::test_b[param]"))
    assert leaves(item("tests/e2e/test_bench_sweep.py::test_a"))
    assert leaves(item("tests/ops/test_quick.py::test_a"))
    assert leaves(None)  # the worker's last test


@dataclass
class Marked:
    nodeid: str
    e2e: bool

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "e2e" and self.e2e else None


def test_workers_collect_the_stack_modules_then_the_other_engines_then_the_rest() -> None:
    items = [
        Marked("tests/charts/test_a.py::test_1", e2e=False),
        Marked("tests/e2e/test_bench_sweep.py::test_2", e2e=True),
        Marked(f"{STACK[1]}::test_3", e2e=True),
        Marked("tests/ops/test_installed_wheel.py::test_4", e2e=True),
        Marked("tests/charts/test_a.py::test_5", e2e=False),
        Marked(f"{STACK[0]}::test_6", e2e=True),
    ]
    xdist_scheduling.engines_first(items)  # type: ignore[arg-type]
    assert [item.nodeid.rsplit("_", 1)[1] for item in items] == ["3", "6", "2", "4", "1", "5"]
