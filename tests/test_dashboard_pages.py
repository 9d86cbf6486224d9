"""Every page of the on-call dashboard under AppTest, on copies of the sample runs served together (a directory of
two runs, as ``bedside serve RUNS_DIR``): what each page shows, checked against the store the dashboard built, and
the links alerts send (``/incidents?run=NAME&incident=ID``)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_app import (
    CLEAN,
    FAULTS,
    PAGES,
    REWIND,
    assert_rendered,
    chart,
    chart_keys,
    from_store,
    go_to,
    open_page,
    serve,
    table,
    texts,
    tiles,
)

from bedside.app.dashboard import registry
from bedside.app.dashboard.common import age, linked_run
from bedside.app.dashboard.figures import FADED, RANK_LINES
from bedside.app.dashboard.summaries import incident_name

OVERVIEW_TILES = [
    "Status",
    "Step",
    "Tokens",
    "FLOPs spent",
    "Tokens/s",
    "MFU",
    "Since good checkpoint",
    "Open incidents",
]
YOUNG_DALY_TILES = ["Save cost (median)", "Interruptions seen", "Recommended interval", "Current interval"]


# -- every page ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run", [FAULTS, REWIND])
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_each_run(served: Path, page: str, run: str) -> None:
    app = open_page(page, run=run)
    assert_rendered(app)
    assert app.sidebar.selectbox(key="run").value == run
    assert app.title and not app.error


def test_the_pages_keep_the_chosen_run_from_page_to_page(served: Path) -> None:
    app = open_page("overview", run=REWIND)
    for page in PAGES:
        assert_rendered(go_to(app, page))
        assert app.sidebar.selectbox(key="run").value == REWIND


# -- overview -----------------------------------------------------------------------------------------------------


def test_the_overview_shows_the_finished_run_at_step_200_and_its_eval_against_compute(served: Path) -> None:
    app = open_page("overview", run=FAULTS)
    assert_rendered(app)
    shown = tiles(app)
    assert list(shown) == OVERVIEW_TILES
    assert (shown["Status"], shown["Step"]) == ("finished", "200")
    assert shown["MFU"].endswith("%") and shown["Tokens"] != "–" and shown["FLOPs spent"] != "–"
    [[still_open]] = from_store(served / FAULTS, "SELECT count(*) FROM incidents WHERE status <> 'resolved'").values
    assert still_open >= 1 and shown["Open incidents"] == str(still_open)

    assert chart_keys(app) == ["eval_vs_compute", "training_curves", "goodput"]
    figure = chart(app, "eval_vs_compute")
    assert figure["layout"]["xaxis"]["type"] == "log"
    evals = from_store(
        served / FAULTS, "SELECT cum_flops, value FROM eval_scores WHERE name = 'excess_loss' ORDER BY step"
    )
    lines = {trace["name"]: trace for trace in figure["data"]}
    assert set(lines) == {"timeline 0", "warning incident", "critical incident"}
    np.testing.assert_allclose(lines["timeline 0"]["x"], evals["cum_flops"])
    np.testing.assert_allclose(lines["timeline 0"]["y"], evals["value"])


def test_the_eval_against_compute_marks_each_incident_where_it_began(served: Path) -> None:
    figure = chart(open_page("overview", run=FAULTS), "eval_vs_compute")
    evals = from_store(
        served / FAULTS, "SELECT step, cum_flops, value FROM eval_scores WHERE name = 'excess_loss' ORDER BY step"
    )
    incidents = from_store(served / FAULTS, "SELECT severity, start_step, title FROM incidents ORDER BY start_step")
    marks = sorted(
        (x, y, label)
        for trace in figure["data"]
        if trace["name"].endswith(" incident")
        for x, y, label in zip(trace["x"], trace["y"], trace["text"])
    )
    assert len(marks) == len(incidents)  # every one began after the first eval
    for (x, y, label), incident in zip(marks, incidents.itertuples()):
        assert label == f"{incident.title} (step {incident.start_step})"
        assert x == pytest.approx(np.interp(incident.start_step, evals["step"], evals["cum_flops"]))
        assert y == pytest.approx(np.interp(incident.start_step, evals["step"], evals["value"]))


def test_the_training_curves_shade_each_incident_about_the_numbers_by_severity(served: Path) -> None:
    figure = chart(open_page("overview", run=FAULTS), "training_curves")
    incidents = from_store(
        served / FAULTS, "SELECT start_step, end_step, severity, kinds FROM incidents ORDER BY start_step"
    )
    about_numbers = incidents[incidents["kinds"].map(lambda kinds: set(kinds) != {"straggler"})]
    assert len(about_numbers) == len(incidents) - 1  # the straggler is about speed: the ranks page shows it
    colors = {"warning": "#f59e0b", "critical": "#dc2626"}
    expected = [(start - 0.5, end + 0.5, colors[severity]) for start, end, severity, _ in about_numbers.values]
    for axis in ("x", "x2", "x3"):  # loss, gradient norm and LR
        shaded = [s for s in figure["layout"]["shapes"] if s["type"] == "rect" and s["xref"] == axis]
        assert sorted((s["x0"], s["x1"], s["fillcolor"]) for s in shaded) == expected


def test_the_training_curves_fade_the_abandoned_timeline_and_mark_the_rewind(served: Path) -> None:
    figure = chart(open_page("overview", run=REWIND), "training_curves")
    # The bad shards' spike on the abandoned timeline is an incident, marked in the legend as such.
    assert sorted({t["name"] for t in figure["data"]}) == ["timeline 0", "timeline 1", "warning incident"]
    lines = {(t["yaxis"], t["name"]): t for t in figure["data"] if t["name"].startswith("timeline")}
    panels = {axis for axis, _ in lines}
    assert len(panels) == 5 and len(lines) == 10  # loss, gradient norm, LR, throughput, step time: a line a timeline
    assert {t["opacity"] for (_, name), t in lines.items() if name == "timeline 0"} == {FADED}
    assert {t["opacity"] for (_, name), t in lines.items() if name == "timeline 1"} == {1.0}
    [[rewound_at]] = from_store(
        served / REWIND, "SELECT step FROM action_events WHERE action = 'rewind' AND status = 'applied'"
    ).values
    marks = [s for s in figure["layout"]["shapes"] if s["type"] == "line"]
    assert len(marks) == len(panels) and {s["x0"] for s in marks} == {rewound_at}
    assert {a["text"] for a in figure["layout"]["annotations"] if a["xref"].startswith("x")} == {"rewind"}


def test_the_overview_says_where_the_wall_time_went_abandoned_timeline_included(served: Path) -> None:
    app = open_page("overview", run=REWIND)
    shares = from_store(served / REWIND, "SELECT category, share FROM goodput").set_index("category")["share"]
    figure = chart(app, "goodput")
    assert figure["layout"]["title"]["text"].startswith(f"Goodput: {shares['productive']:.1%} of the wall time")
    drawn = {t["name"]: float(t["x"][0]) for t in figure["data"]}
    assert drawn == pytest.approx({name.replace("_", " "): share for name, share in shares.items()})
    assert figure["data"][0]["name"] == "productive" and "abandoned timeline" in drawn


# -- incidents ----------------------------------------------------------------------------------------------------


def test_the_incidents_page_lists_the_incidents_the_detectors_found(served: Path) -> None:
    app = open_page("incidents", run=FAULTS)
    assert_rendered(app)
    found = from_store(served / FAULTS, "SELECT incident_id, severity, status, title, kinds, ranks FROM incidents")
    assert {kind for kinds in found["kinds"] for kind in kinds} >= {"loss_spike", "straggler", "nonfinite"}
    listed = table(app, "severity", "status", "title", "steps", "id")
    assert sorted(zip(listed["id"], listed["severity"], listed["status"], listed["title"])) == sorted(
        zip(found["incident_id"], found["severity"], found["status"], found["title"])
    )
    assert list(listed["status"]).index("open") == 0  # open first
    ranks = dict(zip(found["incident_id"], found["ranks"]))  # an incident's ranks as ranges: all it names, not its id's
    named = [f"{incident_name(i, ranks[i])}: {t}" for i, t in zip(listed["id"], listed["title"])]
    assert app.selectbox(key="incident").options == named


def test_each_incident_opens_to_its_evidence_and_findings(served: Path) -> None:
    app = open_page("incidents", run=FAULTS)
    incidents = from_store(served / FAULTS, "SELECT incident_id, title, ranks, findings FROM incidents")
    world = from_store(served / FAULTS, "SELECT rank FROM ranks")["rank"].tolist()
    for incident in incidents.itertuples():
        app.selectbox(key="incident").set_value(incident.incident_id).run()
        assert_rendered(app)
        assert incident.title in app.subheader[0].value
        evidence = chart(app, "incident_evidence")
        rank_lines = [t["name"] for t in evidence["data"] if t["name"].startswith("rank ")]
        lined = sorted(world) if len(world) <= RANK_LINES else sorted(incident.ranks)  # a few ranks: all drawn
        assert rank_lines == ([f"rank {r}" for r in lined] if len(incident.ranks) else [])
        assert len(table(app, "kind", "severity", "active", "evidence")) == incident.findings


def test_an_incident_on_an_abandoned_timeline_says_what_the_rewind_cost(served: Path) -> None:
    app = open_page("incidents", run=REWIND)
    [abandoned] = from_store(served / REWIND, "SELECT incident_id FROM incidents WHERE timeline = 0").values
    app.selectbox(key="incident").set_value(abandoned[0]).run()
    [cost] = [c.value for c in app.caption if c.value.startswith("Timeline 0 was abandoned")]
    assert cost.startswith("Timeline 0 was abandoned from step 61: 25 steps trained past it (61-85) bought nothing")


def test_the_incidents_page_says_so_when_a_run_has_none(clean_runs: Path) -> None:
    serve(clean_runs)
    app = open_page("incidents", run=CLEAN)
    assert_rendered(app)
    [said] = [s.value for s in app.success]
    assert said.startswith("No incidents (detectors ran at ")
    assert not chart_keys(app) and app.sidebar.selectbox(key="run").value == CLEAN


# -- checkpoints --------------------------------------------------------------------------------------------------


def test_the_checkpoints_page_shows_the_work_at_risk_and_the_young_daly_interval(served: Path) -> None:
    app = open_page("checkpoints", run=FAULTS)
    assert_rendered(app)
    assert chart_keys(app) == ["checkpoint_timeline"]
    saved = table(app, "step", "save_s", "state", "started")
    assert list(saved["step"]) == [200, 150, 100, 50]  # newest first
    shown = tiles(app)
    assert list(shown)[-4:] == YOUNG_DALY_TILES
    assert (shown["Last good checkpoint"], shown["Steps at risk"]) == ("step 200", "0")

    [[first, last]] = from_store(served / FAULTS, "SELECT min(time), max(time) FROM steps").values
    save_s, mtbf_s = float(saved["save_s"].median()), last - first  # no restart seen: one after the span
    interval_s = float(np.median(np.diff(sorted(saved["started"].map(pd.Timestamp.timestamp)))))
    optimal_s = math.sqrt(2 * save_s * mtbf_s)
    assert shown["Save cost (median)"] == f"{save_s:.2f} s"
    assert shown["Interruptions seen"] == "0"
    assert shown["Recommended interval"] == age(optimal_s)
    assert shown["Current interval"] == age(interval_s)


# -- SQL ----------------------------------------------------------------------------------------------------------


def test_the_sql_page_runs_an_example_and_offers_the_result_as_csv(served: Path) -> None:
    app = open_page("sql", run=FAULTS)
    app.selectbox(key="example").select("loss around a step").run()
    [[onset]] = from_store(served / FAULTS, "SELECT max(start_step) FROM incidents").values
    assert f"BETWEEN {onset - 10} AND {onset + 10}" in app.text_area(key="sql").value
    app.button(key="run_sql").click().run()
    assert_rendered(app)
    result = table(app, "step", "loss", "grad_norm", "shards")
    assert list(result["step"]) == list(range(onset - 10, onset + 11))
    assert "21 rows" in [c.value for c in app.caption]
    app = app.button(key="sql_csv").click().run()
    assert_rendered(app)
    assert [m.value for m in app.markdown if "Download CSV" in m.value and "(all 21 rows, " in m.value]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        pytest.param("SELEC step FROM steps", "SQL error: Parser Error", id="bad SQL"),
        pytest.param("DELETE FROM steps", "only SELECT queries are allowed here, got DELETE", id="delete"),
        pytest.param("SELECT * FROM read_csv('/etc/passwd')", "read_csv() reads files", id="file access"),
        pytest.param(
            "WITH x AS (DELETE FROM steps RETURNING *) SELECT * FROM x",
            "a console query may only read",
            id="delete in a CTE",
        ),
    ],
)
def test_the_sql_page_shows_refused_sql_as_an_error_not_a_traceback(served: Path, sql: str, message: str) -> None:
    app = open_page("sql", run=FAULTS)
    app.text_area(key="sql").input(sql)
    app.button(key="run_sql").click().run()
    assert_rendered(app)
    [error] = app.error
    assert error.value.startswith(message)
    assert not app.dataframe and not app.download_button
    assert "root:" not in texts(app)
    [[steps]] = from_store(served / FAULTS, "SELECT count(*) FROM steps").values
    assert steps > 0


# -- links from alerts --------------------------------------------------------------------------------------------


def test_a_link_from_an_alert_opens_its_run_and_incident(served: Path) -> None:
    incidents = from_store(served / FAULTS, "SELECT incident_id, title FROM incidents ORDER BY status DESC, opened_at")
    linked = incidents[incidents["incident_id"].str.startswith("straggler")].iloc[0]
    app = open_page("incidents", run=FAULTS, incident=linked["incident_id"])
    assert_rendered(app)
    assert app.sidebar.selectbox(key="run").value == FAULTS
    assert app.selectbox(key="incident").value == linked["incident_id"]
    assert linked["title"] in app.subheader[0].value


@pytest.mark.parametrize("run", [FAULTS, REWIND])
def test_a_link_picks_the_run_it_names(served: Path, run: str) -> None:
    app = open_page("overview", run=run)
    assert app.sidebar.selectbox(key="run").value == run
    assert tiles(app)["Step"] == {FAULTS: "200", REWIND: "160"}[run]


def test_a_link_to_an_unknown_run_opens_the_first_and_to_an_unknown_incident_says_so(served: Path) -> None:
    app = open_page("incidents", run="no-such-run")
    assert_rendered(app)
    assert app.sidebar.selectbox(key="run").value == app.sidebar.selectbox(key="run").options[0]
    app = open_page("incidents", run=FAULTS, incident="no-such-incident")
    assert_rendered(app)
    assert [w.value for w in app.warning] == [
        "This run has no incident 'no-such-incident' (resolved and gone, or another run's?): choose one below."
    ]
    assert app.selectbox(key="incident").value is None  # none opened in its place
    assert not chart_keys(app) and "Findings" not in [e.label for e in app.expander]
    first = table(app, "id")["id"][0]
    app.selectbox(key="incident").set_value(first).run()
    assert_rendered(app)
    assert not app.warning and chart_keys(app) == ["incident_evidence"]


def test_the_run_chosen_in_the_sidebar_wins_over_the_link(served: Path) -> None:
    app = open_page("incidents", run=FAULTS)
    app.sidebar.selectbox(key="run").select(REWIND).run()
    assert_rendered(go_to(app, "overview"))
    assert app.sidebar.selectbox(key="run").value == REWIND


def test_an_alert_link_naming_the_run_as_run_json_does_finds_a_renamed_folder(tiny_faults: Path) -> None:
    renamed = tiny_faults.rename(tiny_faults.with_name("copied-elsewhere"))
    assert linked_run("tiny-faults", [renamed]) == "copied-elsewhere"
    assert linked_run("copied-elsewhere", [renamed]) == "copied-elsewhere"
    assert linked_run("no-such-run", [renamed]) is None


def test_a_runs_directory_s_bedside_toml_configures_the_dashboard_s_alerts(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bedside.toml").write_text('[notifiers.ops]\ntype = "log"\n')
    serve(tmp_path)
    try:
        assert [n.name for n in registry.desk().settings.notifiers] == ["ops"]
    finally:
        registry.close_all()


@pytest.mark.parametrize(
    "screen", sorted((Path(registry.__file__).parent / "screens").glob("*.py")), ids=lambda p: p.stem
)
def test_no_page_script_shows_a_stray_string(screen: Path) -> None:
    """Streamlit's magic writes a page script's bare expressions into the page: a string under a constant, meant
    as its docstring, appears as text above the title. Only the module's docstring is left alone."""
    body = ast.parse(screen.read_text()).body
    stray = [
        node.lineno
        for node in body[1:]
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    assert stray == [], f"{screen.name}: bare strings at lines {stray} would be drawn on the page"
