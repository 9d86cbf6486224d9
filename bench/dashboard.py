"""Server-side build time of each dashboard page, and the query time of each panel, on a large simulated run.

Run:  OMP_NUM_THREADS=1 python bench/dashboard.py [--ranks 1024] [--steps 20000] [--workdir DIR] [--repeat 3]

Prepare (once per size, kept under --workdir; a re-run reuses it): ``bedside simulate
--ranks R --steps M`` with a few faults so that incidents exist (a loss spike, a NaN step,
a windowed straggler host, a gradient SDC on one rank), then ``bedside collect`` (ingest)
and ``bedside detect`` (detectors, findings and incidents stored), each a subprocess
timed with its peak memory (``wait4``); then the store's size and row counts.

Measure, in this process: the desk of ``app/dashboard/registry.py`` is made for the run and
installed (``registry.install``, as ``bedside serve`` does) and ``desk().data(run)`` is called once, timed: the owner's
``catch_up()`` of the already ingested store (an ingest pass that finds nothing, the
detectors' tick and finish), which the first page build of a fresh ``bedside serve``
process would otherwise include. One ``streamlit.testing.v1.AppTest`` of ``main.py``
then builds every page once untimed (imports, Streamlit's own first-run set-up), and
for each page (``switch_page``) times ``run()``:

- cold: the owner's store version is bumped first, as each ingest pass of a live run
  does, so every named query of ``RunData.frame`` misses its cache; the median of
  --repeat builds, with the first one shown too. DuckDB's buffer pool and the page
  cache stay warm (the store was read before).
- warm: the same page built again with the version unchanged (every query a cache
  hit): what a fragment refresh of a finished run costs; median of --repeat builds.

Each cold build's time is split by wrapping, in this process only, the named queries
(``RunData.timings``, the last execution of each query name), the figure builders of
``figures``/``summaries`` and Streamlit's ``plotly_chart``/``dataframe`` calls (serialising the figure or
frame into the page's messages); "other" is the rest (Streamlit, pandas in the page,
AppTest's own parsing of the messages). The split and the query times are those of the
median cold build. The slowest queries of each page are listed. The Incidents page is
also built cold with each incident selected in turn (its evidence window differs), and
the SQL page with each of its examples run.

Target (the issue): each page built server-side in <= 1 s (cold).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import logging
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

TARGET_S = 1.0
APP = Path(__file__).resolve().parent.parent / "app" / "dashboard" / "main.py"
TOP_QUERIES = 3
MAX_INCIDENTS_SHOWN = 12


def navigation() -> dict[str, str]:
    """The pages main.py navigates, in menu order: name to path relative to main.py (``screens/ranks.py``)."""
    source = APP.read_text()
    folder = re.search(r'^PAGES = Path\(__file__\)\.parent / "([^"]+)"', source, re.M)
    files = re.findall(r'st\.Page\(PAGES / "([^"]+)\.py"', source)
    if not folder or not files:
        sys.exit(f"cannot read the pages of {APP}: update navigation() in this benchmark")
    return {name: f"{folder.group(1)}/{name}.py" for name in files}


PAGES = navigation()


# -- preparing the run --------------------------------------------------------
def fault_specs(ranks: int, steps: int) -> list[str]:
    """A few faults spread over the run, so that the incident pages have something to show."""
    at = lambda share: max(2, int(steps * share))  # noqa: E731
    host = min(3, max(0, ranks // 8 - 1))
    return [
        f"spike:step={at(0.25)},sigma=12",
        f"nan:step={at(0.45)}",
        f"straggler:host={host},factor=1.5,from={at(0.8)},steps={max(1, min(200, steps // 20))}",
        f"sdc_grad:rank={min(5, ranks - 1)},scale_log2=6,step={at(0.9)}",
    ]


def child(argv: list[str]) -> tuple[float, float]:
    """Run ``python -m bedside.app.cli ARGV``; (seconds, peak RSS in GiB); an error if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bedside.app.cli", *argv])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"bedside {' '.join(argv)} failed ({proc.returncode})")
    return elapsed, usage.ru_maxrss / 2**20


def prepare(run: Path, ranks: int, steps: int) -> None:
    """Simulate, ingest and detect the run, each step once; its figures are kept in the run and shown again."""
    done = lambda name: (run / f".bench-{name}").exists()  # noqa: E731
    kept = run / ".bench-preparation.json"
    figures: dict[str, list[float]] = json.loads(kept.read_text()) if kept.exists() else {}
    if done("detected"):
        print(f"reusing {run} (delete it to prepare it again); figures measured when it was prepared:")
    else:
        if not done("simulated"):
            shutil.rmtree(run, ignore_errors=True)
            run.parent.mkdir(parents=True, exist_ok=True)
            inject = [arg for spec in fault_specs(ranks, steps) for arg in ("--inject", spec)]
            print(f"simulating with {' '.join(inject)}")
            figures["simulate"] = child(
                ["simulate", "--ranks", str(ranks), "--steps", str(steps), "--out", str(run), *inject]
            )
            (run / ".bench-simulated").touch()
        if not done("collected"):
            figures["collect (ingest)"] = child(["collect", "--quiet", str(run)])
            (run / ".bench-collected").touch()
        figures["detect"] = child(["detect", str(run)])
        kept.write_text(json.dumps(figures))
        (run / ".bench-detected").touch()
    rows = ranks * steps
    print(f"  {'step':<18} {'seconds':>8} {'peak RSS GiB':>13}")
    for name, (seconds, rss) in figures.items():
        rate = f"  ({rows / seconds:,.0f} rank_step rows/s)" if name.startswith("collect") else ""
        print(f"  {name:<18} {seconds:>8.1f} {rss:>13.2f}{rate}")


def describe(run: Path) -> None:
    """Sizes of the telemetry and the store, and the row counts of its main tables."""
    from bedside.collectors.layout import RunLayout

    layout = RunLayout(run)
    telemetry = sum(p.stat().st_size for p in layout.source_files())
    store = sum(p.stat().st_size for p in run.glob("bedside.duckdb*"))
    con = duckdb.connect(str(layout.store), read_only=True)
    try:
        counts = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("rank_steps", "steps", "evals", "checkpoints", "events", "finding_rows", "incident_rows")
        }
    finally:
        con.close()
    print(
        f"telemetry {telemetry / 2**30:.2f} GiB in {len(layout.source_files())} files; "
        f"store {store / 2**30:.2f} GiB; " + ", ".join(f"{table} {n:,}" for table, n in counts.items())
    )


# -- instrumentation (this process only) --------------------------------------
class Split:
    """Seconds spent in wrapped calls, by category, since the last reset."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, category: str, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # a wrapped call inside another: counted by the outer one
                return fn(*args, **kwargs)
            self._depth += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                self._depth -= 1
                self.seconds[category] += elapsed
                self.calls[f"{category}:{name}"] += elapsed

        return wrapper

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(split: Split) -> None:
    """Wrap the figure builders, the Runs page's file reads and Streamlit's chart and table calls.

    The pages look these up when they run, so the wrappers set here are the ones they call.
    """
    import streamlit as st
    from streamlit.delta_generator import DeltaGenerator

    from bedside.app.dashboard import figures, summaries

    for module, category in ((figures, "figures"), (summaries, "figures")):
        for name in dir(module):
            fn = getattr(module, name)
            if callable(fn) and getattr(fn, "__module__", "") == module.__name__ and not isinstance(fn, type):
                setattr(module, name, split.wrap(category, f"{module.__name__.rsplit('.', 1)[-1]}.{name}", fn))
    for name in ("plotly_chart", "dataframe"):
        setattr(DeltaGenerator, name, split.wrap("st." + name, name, getattr(DeltaGenerator, name)))
        setattr(st, name, split.wrap("st." + name, name, getattr(st, name)))


# -- building pages -------------------------------------------------------------
def build(app: Any, timeout: float, *, fatal: bool = True) -> float:
    """Seconds of one ``AppTest.run()``; a page that raises ends the benchmark (``fatal``), else see ``raised``."""
    started = time.perf_counter()
    app.run(timeout=timeout)
    elapsed = time.perf_counter() - started
    if app.exception and fatal:
        sys.exit(f"the page raised: {app.exception[0].message}\n{''.join(app.exception[0].stack_trace)}")
    return elapsed


def raised(app: Any) -> str:
    """What the last build raised, and the dashboard line it came from; '' when nothing."""
    if not app.exception:
        return ""
    error = app.exception[0]
    frames = [line.strip().splitlines()[0] for line in error.stack_trace if "app/dashboard/" in line]
    return f"{error.message!r} ({frames[-1] if frames else 'no dashboard frame'})"


def measure_pages(run: Path, repeat: int, timeout: float) -> dict[str, dict[str, Any]]:
    from streamlit.testing.v1 import AppTest

    from bedside.app.dashboard import registry

    data = registry.desk().data(run)
    split = Split()
    instrument(split)
    app = AppTest.from_file(str(APP), default_timeout=timeout)
    first_builds = {}
    for page in PAGES:  # untimed round: imports and Streamlit's first-run set-up (caches filled as a side effect)
        if page != next(iter(PAGES)):
            app.switch_page(PAGES[page])
        data.owner.version += 1
        first_builds[page] = build(app, timeout)
    print(
        "first build of each page in this process (imports included, cold caches): "
        + ", ".join(f"{page} {s:.2f} s" for page, s in first_builds.items())
    )

    results: dict[str, dict[str, Any]] = {}
    for page in PAGES:
        app.switch_page(PAGES[page])
        build(app, timeout)  # land on the page (its widgets exist for the builds below)
        cold, queries, splits = [], [], []
        for _ in range(repeat):
            data.owner.version += 1  # what an ingest pass does: every cached frame is stale
            data.timings.clear()
            split.reset()
            cold.append(build(app, timeout))
            queries.append(dict(data.timings))
            splits.append(dict(split.seconds))
        warm = [build(app, timeout) for _ in range(repeat)]
        middle = sorted(range(len(cold)), key=cold.__getitem__)[(len(cold) - 1) // 2]  # the (lower) median build
        results[page] = {
            "first": cold[0],
            "cold": cold[middle],
            "warm": statistics.median(warm),
            "queries": queries[middle],
            "split": splits[middle],
        }
        print(
            f"  {page}: cold {', '.join(f'{s:.2f}' for s in cold)} s; warm {', '.join(f'{s:.3f}' for s in warm)} s",
            flush=True,
        )
    if "incidents" in PAGES:
        results["_incidents"] = {"rows": measure_incidents(app, data, split, timeout)}
    if "sql" in PAGES:
        results["_sql"] = {"rows": measure_sql_examples(app, timeout)}
    return results


def measure_incidents(app: Any, data: Any, split: Split, timeout: float) -> list[dict[str, Any]]:
    """The Incidents page built cold with each incident selected in turn."""
    app.switch_page(PAGES["incidents"])
    build(app, timeout)
    rows = []
    logging.getLogger("streamlit.error_util").setLevel(logging.CRITICAL)  # errors: in the table
    for incident in data.frame("incidents").head(MAX_INCIDENTS_SHOWN).itertuples():
        app.selectbox(key="incident").set_value(incident.incident_id)
        build(app, timeout, fatal=False)  # the selection lands
        data.owner.version += 1
        data.timings.clear()
        split.reset()
        seconds = build(app, timeout, fatal=False)
        rows.append(
            {
                "id": incident.incident_id,
                "kinds": ",".join(incident.kinds),
                "steps": f"{incident.start_step}-{incident.end_step}",
                "ranks": len(incident.ranks),
                "seconds": seconds,
                "queries": sum(data.timings.values()),
                "window_ranks": data.timings.get("window_ranks"),
                "figure": sum(v for k, v in split.seconds.items() if k != "st.dataframe"),
                "error": raised(app),
            }
        )
    return rows


def sql_examples() -> dict[str, str]:
    """The SQL page's EXAMPLES, read from its source (running the module outside Streamlit would build the page)."""
    tree = ast.parse((APP.parent / PAGES["sql"]).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXAMPLES" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def measure_sql_examples(app: Any, timeout: float) -> list[tuple[str, float, str]]:
    """The SQL page with each example typed in and Run clicked (the user query included): (example, s, rows)."""
    app.switch_page(PAGES["sql"])
    build(app, timeout)
    rows = []
    for example, query in sql_examples().items():
        app.text_area(key="sql").input(query)
        build(app, timeout)
        app.button(key="run_sql").click()
        seconds = build(app, timeout)
        shown = [c.value for c in app.caption if c.value.endswith(" rows")]
        rows.append((example, seconds, shown[0] if shown else raised(app) or "no result"))
    return rows


def report(results: dict[str, dict[str, Any]]) -> None:
    print()
    print(
        f"{'page':<12} {'first s':>7} {'cold s':>7} {'warm s':>7} {'queries':>7} {'figures':>7} {'charts':>7} "
        f"{'tables':>7} {'other':>7}  target <= {TARGET_S:g} s (cold)"
    )
    for page in PAGES:
        r = results[page]
        split = r["split"]
        q = sum(r["queries"].values())
        f, c, t = (split.get(k, 0.0) for k in ("figures", "st.plotly_chart", "st.dataframe"))
        verdict = "met" if r["cold"] <= TARGET_S else "MISSED"
        print(
            f"{page:<12} {r['first']:>7.2f} {r['cold']:>7.2f} {r['warm']:>7.3f} {q:>7.2f} {f:>7.2f} {c:>7.2f} "
            f"{t:>7.2f} {r['cold'] - q - f - c - t:>7.2f}  {verdict}"
        )
    print(
        "(first: the first timed cold build; cold: the median build, and the split is that build's; warm: median; "
        "queries: the named queries of "
        "RunData.frame; figures: figures.*/summaries.*; charts/tables: st.plotly_chart/st.dataframe)"
    )
    print()
    print("slowest queries of each page (s, in the median cold build):")
    for page in PAGES:
        queries = sorted(results[page]["queries"].items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{name} {s:.3f}" for name, s in queries[:TOP_QUERIES]) or "(none)"
        rest = sum(s for _, s in queries[TOP_QUERIES:])
        more = f" (+{len(queries) - TOP_QUERIES} more: {rest:.3f})" if len(queries) > TOP_QUERIES else ""
        print(f"  {page:<12} {shown}{more}")
    print()
    print("every query (s, in the median cold build of the first page that ran it):")
    seen: dict[str, tuple[float, str]] = {}
    for page in PAGES:
        for name, s in results[page]["queries"].items():
            seen.setdefault(name, (s, page))
    for name, (s, page) in sorted(seen.items(), key=lambda kv: -kv[1][0]):
        print(f"  dash_{name:<20} {s:>7.3f}  ({page})")
    rows = results.get("_incidents", {}).get("rows")
    if rows:
        print()
        print("Incidents page, cold, each incident selected (figure+chart: incident_window and st.plotly_chart):")
        print(
            f"  {'incident':<34} {'kinds':<28} {'steps':<11} {'ranks':>5} {'page s':>7} {'queries':>7} "
            f"{'window_ranks':>12} {'figure+chart':>12}"
        )
        for r in rows:
            wr = "-" if r["window_ranks"] is None else f"{r['window_ranks']:.3f}"
            tail = f"  RAISED {r['error']}" if r["error"] else ""
            print(
                f"  {r['id'][:34]:<34} {r['kinds'][:28]:<28} {r['steps']:<11} {r['ranks']:>5} {r['seconds']:>7.2f} "
                f"{r['queries']:>7.2f} {wr:>12} {r['figure']:>12.2f}{tail}"
            )
    if results.get("_sql", {}).get("rows"):
        print()
        print("SQL page with an example run (Run clicked; the user query included):")
        for example, s, caption in results["_sql"]["rows"]:
            print(f"  {example:<22} {s:>7.2f} s  {caption}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024, help="world size of the simulated run")
    parser.add_argument("--steps", type=int, default=20_000, help="optimizer steps of the simulated run")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bedside-bench-dashboard",
        help="where the prepared run is kept (reused when present)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="cold and warm builds of each page (medians)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one page build may take")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    run = (args.workdir / f"run-{args.ranks}x{args.steps}").resolve()
    print(
        f"duckdb {duckdb.__version__}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    prepare(run, args.ranks, args.steps)
    describe(run)

    from bedside.app.dashboard import registry

    registry.install(registry.Desk.for_target(run))
    started = time.perf_counter()
    registry.desk().data(run)
    print(
        f"desk().data(run), the owner's catch_up() of the ingested store: {time.perf_counter() - started:.2f} s "
        f"(peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB)"
    )
    try:
        results = measure_pages(run, args.repeat, args.timeout)
        report(results)
        print(
            f"\npeak RSS of this process after the pages: "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
        )
    finally:
        registry.close_all()
    print(f"load average {os.getloadavg()[0]:.2f} (other processes on the machine skew the figures)")


if __name__ == "__main__":
    main()
