"""Boundaries you can test: walk the imports of every package and fail on a crossing.

Rules (docs/architecture.md "Packages", DESIGN "Folders"): dependencies point one way,
``collectors`` <- ``detectors`` <- the service (``app/service``) <- the dashboard and the CLI.
collectors/ knows nothing of detectors, app or trainer; detectors/ imports only the standard
library (no threads, processes, files or network), numpy, pandas, scipy and itself; the service
never imports the dashboard or a CLI module; the dashboard never imports a CLI module (every
module of app/ outside service/ and dashboard/); trainer/ uses only the telemetry writer of ours, the instrumentation kit,
the control client's key and safe file reader, and the fault catalog; ``duckdb.connect`` is called in
collectors/store/__init__.py only; importing the CLI loads no subsystem it does not need, and ``bedside --help``,
``bedside --version`` and ``bedside COMMAND --help`` load none of the heavy libraries (each handler imports them).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("collectors", "detectors", "app", "trainer")
HEAVY = ("torch", "streamlit")
DETECTORS_MAY_USE = ("numpy", "pandas", "scipy")
PURE_STDLIB = (
    "__future__",
    "_typeshed",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "inspect",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "re",
    "statistics",
    "string",
    "types",
    "typing",
    "warnings",
)
"""The standard library's modules that compute and do nothing else: no threads, processes, files or network."""
FINDS_ITS_MODULES = {"bedside.detectors.lazy": ("importlib",), "bedside.detectors.registry": ("importlib", "pkgutil")}
"""Packages load their own modules on first use, and the registry lists them from the package's ``__path__``."""
NO_IO_CALLS = ("open", "print", "input", "exec", "eval", "breakpoint")
SERVICE = "bedside.app.service"
DASHBOARD = "bedside.app.dashboard"
CONNECT_MODULE = "bedside.collectors.store"
INTEGRATIONS = "bedside.collectors.integrations"
KIT = "bedside.collectors.kit"
"""The instrumentation kit: torch (an optional extra) but no framework."""
FRAMEWORKS = {
    "transformers": "huggingface",
    "accelerate": "huggingface",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "torchtitan": "torchtitan",
}
"""Each training framework and the one integration module that may import it (which may import torch too)."""
START_UP_HEAVY = ("pandas", "duckdb", "pyarrow", "numpy", "scipy", "streamlit", "plotly", "torch", "watchdog")
"""What building the CLI's parser must not load: a command's handler imports them when it runs."""
TRAINER_MAY_USE = (
    "bedside.collectors.writer",
    "bedside.collectors.kit",
    "bedside.collectors.controlkey",
    "bedside.collectors.safefile",
    "bedside.detectors.faults",
)
TRAINER_MAY_TAKE_FROM_COLLECTORS = {"RunLogger"}


@dataclass(frozen=True)
class Import:
    """One import statement (or importlib call) of a module, resolved to absolute names."""

    module: str
    names: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Module:
    """A source file of ours: its dotted name, whether it is a package, and its tree."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def load_module(path: Path) -> Module:
    parts = path.relative_to(ROOT).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    name = ".".join(("bedside",) + (parts[:-1] if is_package else parts))
    return Module(name, path, is_package, ast.parse(path.read_text(), filename=str(path)))


def modules_of(package: str) -> list[Module]:
    return [load_module(p) for p in sorted((ROOT / package).rglob("*.py"))]


def resolve(module: Module, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` inside ``module``."""
    if level == 0:
        return target or ""
    base = module.package.split(".")
    if level > 1:
        base = base[: -(level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: Module) -> list[Import]:
    """Every import in ``module``, lazy ones inside functions and importlib calls included."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, (), node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            found.append(Import(resolve(module, node.level, node.module), names, node.lineno))
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            found.append(Import(node.args[0].value, (), node.lineno))
    return found


def _dynamic_import(node: ast.Call) -> bool:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0] if node.args else None
    return called in ("import_module", "__import__") and isinstance(getattr(first, "value", None), str)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imported_names(imp: Import) -> list[str]:
    """The module and, for ``from M import a, b``, ``M.a`` and ``M.b`` (submodules may hide there)."""
    return [imp.module] + [f"{imp.module}.{n}" for n in imp.names]


def crossings(package: str, forbidden: tuple[str, ...], *, outside: tuple[str, ...] = ()) -> list[str]:
    """The imports of ``package``'s modules (those not within one of ``outside``) that reach into ``forbidden``."""
    return [
        f"{m.path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for m in modules_of(package)
        if not any(within(m.name, o) for o in outside)
        for imp in imports_of(m)
        if any(within(name, f) for name in imported_names(imp) for f in forbidden)
    ]


def detectors_allow(imp: Import, module: str = "") -> bool:
    """Whether ``module`` of detectors/ may import ``imp``: its own modules, numpy, pandas, scipy, and the pure
    modules of the standard library (the registry also finds the package's modules)."""
    top = imp.module.split(".")[0]
    return (
        within(imp.module, "bedside.detectors")
        or top in DETECTORS_MAY_USE
        or top in PURE_STDLIB
        or top in FINDS_ITS_MODULES.get(module, ())
    )


def io_calls(module: Module) -> list[str]:
    """Calls of the builtins that read, write or run code (``open``, ``print``, ...) in ``module``."""
    return [
        f"{module.path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}()"
        for node in ast.walk(module.tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NO_IO_CALLS
    ]


def is_cli_module(name: str) -> bool:
    """A module of app/ that is the CLI's: anything in app/ but the service and the dashboard."""
    return (
        within(name, "bedside.app") and name != "bedside.app" and not (within(name, SERVICE) or within(name, DASHBOARD))
    )


def app_crossings(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """Imports of a part of app/ (``package``, dotted) that reach a CLI module or one of ``forbidden``."""
    return [
        f"{m.path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for m in modules_of("app")
        if within(m.name, package)
        for imp in imports_of(m)
        if any(is_cli_module(name) or any(within(name, f) for f in forbidden) for name in imported_names(imp))
    ]


def trainer_allows(imp: Import) -> bool:
    if not within(imp.module, "bedside") or within(imp.module, "bedside.trainer"):
        return True
    if any(within(imp.module, allowed) for allowed in TRAINER_MAY_USE):
        return True
    return imp.module == "bedside.collectors" and set(imp.names) <= TRAINER_MAY_TAKE_FROM_COLLECTORS and bool(imp.names)


def duckdb_connect_calls(module: Module) -> list[int]:
    """Lines where ``module`` calls duckdb.connect (under any alias) or imports connect itself."""
    aliases = {
        a.asname or a.name
        for n in ast.walk(module.tree)
        if isinstance(n, ast.Import)
        for a in n.names
        if a.name == "duckdb"
    }
    lines = [
        n.lineno
        for n in ast.walk(module.tree)
        if isinstance(n, ast.ImportFrom) and n.module == "duckdb" and any(a.name == "connect" for a in n.names)
    ]
    lines += [
        n.lineno
        for n in ast.walk(module.tree)
        if isinstance(n, ast.Attribute)
        and n.attr == "connect"
        and isinstance(n.value, ast.Name)
        and n.value.id in aliases
    ]
    return lines


# -- the walker itself ------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "is_package", "level", "target", "expected"),
    [
        ("bedside.collectors.ingest", False, 1, "store", "bedside.collectors.store"),
        ("bedside.collectors.store", True, 2, "errors", "bedside.collectors.errors"),
        ("bedside.collectors.store", True, 3, "detectors", "bedside.detectors"),
        ("bedside.app.cli", False, 1, None, "bedside.app"),
        ("bedside.app.cli", False, 2, "trainer.model", "bedside.trainer.model"),
        ("bedside.app.cli", False, 0, "torch", "torch"),
    ],
)
def test_relative_imports_resolve_to_the_package(module, is_package, level, target, expected) -> None:
    fake = Module(module, ROOT, is_package, ast.parse(""))
    assert resolve(fake, level, target) == expected


def test_walker_sees_lazy_relative_and_dynamic_imports() -> None:
    source = (
        "import duckdb as db\n"
        "def f():\n    from ...detectors import registry\n    import importlib\n"
        "    importlib.import_module('streamlit')\n    return db.connect(':memory:')\n"
    )
    module = Module("bedside.collectors.store.x", ROOT, False, ast.parse(source))
    modules = {imp.module for imp in imports_of(module)}
    assert {"bedside.detectors", "streamlit", "duckdb"} <= modules
    assert duckdb_connect_calls(module) == [6]


def test_walker_finds_our_sources() -> None:
    names = {m.name for m in modules_of("collectors")}
    assert {"bedside.collectors", "bedside.collectors.ingest", "bedside.collectors.store"} <= names
    assert all(modules_of(p) for p in PACKAGES)


# -- the rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("collectors", HEAVY + ("bedside.detectors", "bedside.app", "bedside.trainer")),
        ("detectors", HEAVY + ("bedside.collectors", "bedside.app", "bedside.trainer")),
    ],
)
def test_package_does_not_cross_its_boundary(package: str, forbidden: tuple[str, ...]) -> None:
    assert crossings(package, forbidden + tuple(FRAMEWORKS), outside=(INTEGRATIONS, KIT)) == []


def test_the_kit_imports_torch_but_no_framework() -> None:
    forbidden = ("streamlit", "bedside.detectors", "bedside.app", "bedside.trainer", *FRAMEWORKS)
    kit = [f"{m.path.relative_to(ROOT)}" for m in modules_of("collectors") if within(m.name, KIT)]
    assert len(kit) > 1
    assert [c for c in crossings("collectors", forbidden) if c.split(":")[0] in kit] == []


def test_integrations_import_each_framework_in_its_own_module_only() -> None:
    downstream = ("streamlit", "bedside.detectors", "bedside.app", "bedside.trainer")
    bad = crossings("collectors", downstream)
    for m in modules_of("collectors"):
        if within(m.name, INTEGRATIONS):
            for imp in imports_of(m):
                top = imp.module.split(".")[0]
                if top in FRAMEWORKS and m.name != f"{INTEGRATIONS}.{FRAMEWORKS[top]}":
                    bad.append(f"{m.path.relative_to(ROOT)}:{imp.line} imports {imp.module}")
    assert bad == []


def test_detectors_are_pure_statistics() -> None:
    bad = [
        f"{m.path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for m in modules_of("detectors")
        for imp in imports_of(m)
        if not detectors_allow(imp, m.name)
    ]
    bad += [call for m in modules_of("detectors") for call in io_calls(m)]
    assert bad == []


def test_the_io_call_check_sees_builtins_only() -> None:
    source = "def f(p):\n    print(p)\n    with open(p) as f:\n        pass\n    return frame.open()\n"
    module = Module("bedside.detectors.x", ROOT / "detectors" / "x.py", False, ast.parse(source))
    assert io_calls(module) == ["detectors/x.py:2 calls print()", "detectors/x.py:3 calls open()"]


@pytest.mark.parametrize(
    ("imp", "allowed"),
    [
        (Import("numpy", (), 1), True),
        (Import("scipy.stats", ("norm",), 1), True),
        (Import("bedside.detectors.finding", ("Finding",), 1), True),
        (Import("math", (), 1), True),
        (Import("threading", (), 1), False),
        (Import("logging", (), 1), False),
        (Import("gzip", (), 1), False),
        (Import("importlib", (), 1), False),
        (Import("ctypes", (), 1), False),
        (Import("pathlib", ("Path",), 1), False),
        (Import("pyarrow", (), 1), False),
        (Import("duckdb", (), 1), False),
        (Import("bedside.collectors.errors", ("BedsideError",), 1), False),
    ],
)
def test_detectors_rule_tells_statistics_from_the_rest(imp: Import, allowed: bool) -> None:
    assert detectors_allow(imp) is allowed


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        (SERVICE, HEAVY + (DASHBOARD, "bedside.trainer")),
        (DASHBOARD, ("torch", "bedside.trainer")),
    ],
)
def test_service_and_dashboard_never_reach_up_into_the_cli(package: str, forbidden: tuple[str, ...]) -> None:
    assert app_crossings(package, forbidden) == []


@pytest.mark.parametrize(
    ("name", "cli"),
    [
        ("bedside.app.cli", True),
        ("bedside.app.output", True),
        ("bedside.app.simulation.write", True),
        ("bedside.app.service.owner", False),
        ("bedside.app.dashboard.registry", False),
        ("bedside.app", False),
    ],
)
def test_cli_modules_are_app_outside_the_service_and_dashboard(name: str, cli: bool) -> None:
    assert is_cli_module(name) is cli


def test_trainer_uses_only_the_telemetry_writer_of_ours() -> None:
    bad = [
        f"{m.path.relative_to(ROOT)}:{imp.line} imports {imp.module} {imp.names}"
        for m in modules_of("trainer")
        for imp in imports_of(m)
        if not trainer_allows(imp)
    ]
    assert bad == []


@pytest.mark.parametrize(
    ("imp", "allowed"),
    [
        (Import("bedside.collectors.writer", ("RunLogger",), 1), True),
        (Import("bedside.collectors", ("RunLogger",), 1), True),
        (Import("bedside.trainer.config", ("tiny_cpu",), 1), True),
        (Import("torch.distributed", (), 1), True),
        (Import("bedside.collectors", ("Kind",), 1), False),
        (Import("bedside.collectors", (), 1), False),
        (Import("bedside.collectors.store", ("Store",), 1), False),
        (Import("bedside.detectors", (), 1), False),
        (Import("bedside.detectors.faults", ("TRAINER_FAULTS",), 1), True),
        (Import("bedside.detectors.finding", ("Finding",), 1), False),
    ],
)
def test_trainer_rule_tells_the_writer_from_the_rest(imp: Import, allowed: bool) -> None:
    assert trainer_allows(imp) is allowed


def test_duckdb_connect_is_called_in_the_store_module_only() -> None:
    calls = {m.name: duckdb_connect_calls(m) for p in PACKAGES for m in modules_of(p)}
    assert {name for name, lines in calls.items() if lines} == {CONNECT_MODULE}


def test_importing_collectors_detectors_and_cli_loads_neither_torch_nor_streamlit() -> None:
    code = (
        "import json, sys\n"
        "import bedside.collectors, bedside.collectors.ingest, bedside.collectors.query\n"
        "import bedside.detectors, bedside.app.cli\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def heavy_modules_loaded_by(argv: list[str]) -> list[str]:
    """The heavy libraries (``START_UP_HEAVY``) in ``sys.modules`` after ``bedside ARGV`` ran in a new process."""
    code = (
        "import json, sys\n"
        "from bedside.app.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({START_UP_HEAVY!r}))),"
        " file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stderr.splitlines()[-1])


def cli_commands() -> list[list[str]]:
    """Every (sub-)command's ``--help`` argv: ``["collect", "--help"]``, ``["alert", "test", "--help"]``, ..."""
    from bedside.app.cli import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        found = [prefix + ["--help"]]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, prefix + [name])
        return found

    return walk(build_parser(), [])


@pytest.mark.parametrize("argv", [["--version"], *cli_commands()], ids=" ".join)
def test_help_and_version_load_no_heavy_library(argv: list[str]) -> None:
    assert heavy_modules_loaded_by(argv) == []


def test_the_start_up_check_sees_a_heavy_library_a_command_loads() -> None:
    assert "pandas" in heavy_modules_loaded_by(["runs", "/nonexistent"])
