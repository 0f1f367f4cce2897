"""The project's import graph, read from the sources: no circles, the CLI on top (nothing imports
`dflash_ops.cli` but the CLI itself), the benchmark's core below its experiments, the patch
tool standing alone (the engine image installs it without the operations code), and no module
over 600 lines (one job each).

Every import counts, at module level or inside a function (a lazy import is still an arrow), and
each test that adds one forbidden import to the real sources shows the rule catches it."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = (
    ROOT / "ops" / "dflash_ops",
    ROOT / "service" / "dflash_sidecar",
    ROOT / "patches" / "dflash_patches",
)


def project_sources() -> dict[str, str]:
    """Module name -> source text, for every module of the three packages."""
    sources = {}
    for package in SOURCE_ROOTS:
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            sources[name] = path.read_text()
    return sources


def imported_modules(name: str, source: str, modules: Iterable[str]) -> set[str]:
    """The project modules `name` imports: each import resolved to the most specific module
    (`from a.b import c` is a.b.c when c is a module, else a.b)."""
    known = set(modules)
    found = set()
    for node in ast.walk(ast.parse(source, filename=name)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in known
                else node.module
                for alias in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    return {name: imported_modules(name, text, sources) for name, text in sources.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(sources: Mapping[str, str]) -> list[str]:
    graph = import_graph(sources)
    found = [f"import circle: {' <-> '.join(c)}" for c in circles(graph)]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if within(target, "dflash_ops.cli") and not within(module, "dflash_ops.cli"):
                found.append(f"{module} imports {target}: only the CLI imports dflash_ops.cli")
            if (
                within(module, "dflash_ops.bench.core")
                and within(target, "dflash_ops.bench")
                and not within(target, "dflash_ops.bench.core")
            ):
                found.append(
                    f"{module} imports {target}: the bench core imports nothing else of bench"
                )
            if within(module, "dflash_patches") and within(target, "dflash_ops"):
                found.append(f"{module} imports {target}: the patch tool stands alone")
    for module, text in sorted(sources.items()):
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES and module not in LONG_MODULES:
            found.append(
                f"{module} has {lines} lines: a module over {MAX_MODULE_LINES} holds more "
                "than one job; split it"
            )
    return found


# A module a newcomer can hold: one job each. LONG_MODULES names the exceptions (none).
MAX_MODULE_LINES = 600
LONG_MODULES: frozenset[str] = frozenset()


def test_the_sources_keep_every_rule() -> None:
    sources = project_sources()
    assert "dflash_ops.bench.core.runner" in sources and "dflash_patches" in sources
    assert violations(sources) == []


def test_lazy_and_from_imports_are_arrows() -> None:
    modules = ["pkg", "pkg.a", "pkg.b", "pkg.c"]
    source = "import pkg.a\ndef f():\n    from pkg import b\n    from pkg.c import thing\n"
    assert imported_modules("pkg.d", source, modules) == {"pkg.a", "pkg.b", "pkg.c"}
    assert imported_modules("pkg.d", "from pkg import b, name", modules) == {"pkg", "pkg.b"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Each import a rule forbids, put back into the real sources: (module, line, what is reported).
def test_a_module_over_the_size_is_a_violation() -> None:
    sources = {"pkg.small": "x = 1\n" * 10, "pkg.big": "x = 1\n" * (MAX_MODULE_LINES + 1)}
    assert violations(sources) == [
        f"pkg.big has {MAX_MODULE_LINES + 1} lines: a module over {MAX_MODULE_LINES} holds "
        "more than one job; split it"
    ]


PUT_BACK = [
    pytest.param(
        "dflash_ops.chart.generated_files",
        "from dflash_ops.generate import main",
        "import circle: dflash_ops.chart.generated_files <-> dflash_ops.generate",
        id="circle-generate",
    ),
    pytest.param(
        "dflash_ops.cli.bench.flags",
        "from dflash_ops.cli.bench.sweep import settings_of",
        "import circle: dflash_ops.cli.bench.flags <-> dflash_ops.cli.bench.sweep",
        id="circle-cli-siblings",
    ),
    pytest.param(
        "dflash_ops.bench.core.client",
        "from dflash_ops.cli.arguments import check_http_url",
        "dflash_ops.bench.core.client imports dflash_ops.cli.arguments: only the CLI",
        id="cli-from-product-code",
    ),
    pytest.param(
        "dflash_ops.bench.core.runner",
        "    from dflash_ops.bench.sweep.analysis import table",
        "dflash_ops.bench.core.runner imports dflash_ops.bench.sweep.analysis: the bench core",
        id="core-imports-experiment",
    ),
    pytest.param(
        "dflash_patches.series",
        "from dflash_ops.paths import REPO_ROOT",
        "dflash_patches.series imports dflash_ops.paths: the patch tool stands alone",
        id="patches-import-ops",
    ),
]


@pytest.mark.parametrize(("module", "line", "reported"), PUT_BACK)
def test_each_forbidden_import_put_back_is_found(module: str, line: str, reported: str) -> None:
    sources = project_sources()
    assert module in sources, f"{module} moved: update the put-back case"
    if line.startswith(" "):
        line = "def _lazy():\n" + line
    sources[module] += "\n" + line + "\n"
    found = violations(sources)
    assert any(v.startswith(reported) for v in found), found
