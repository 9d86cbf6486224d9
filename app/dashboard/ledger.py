"""The ledger across runs: which hosts (and ranks) the incidents of a runs directory name, and how concentrated the
evictions are ("3 of 63 hosts account for half of all evictions"). Plain functions of the ``ledger`` and ``ranks``
query results of each run (no Streamlit), shared by the Runs page and ``bedside ledger``."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

LEDGER_COLUMNS = ["host", "runs", "incidents", "evictions", "ranks", "kinds", "last_run"]
UNPLACED = "(no host)"
"""The host of a rank whose run says none."""


def host_ledger(ledgers: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per host named by an incident in any of ``ledgers`` (run name to its ``ledger`` rows, newest run
    first): the runs and incidents that name it, the incidents suggesting its eviction, its ranks and the kinds,
    most evictions first."""
    named = [frame.assign(run=name, order=i) for i, (name, frame) in enumerate(ledgers.items()) if not frame.empty]
    if not named:
        return pd.DataFrame(columns=LEDGER_COLUMNS)
    rows = pd.concat(named, ignore_index=True)
    rows["host"] = rows["host"].fillna(UNPLACED)
    rows["incident"] = rows["run"] + "/" + rows["incident_id"]
    rows["evicted"] = rows["incident"].where(rows["evict"].fillna(False).astype(bool))
    per_host = rows.groupby("host").agg(
        runs=("run", "nunique"),
        incidents=("incident", "nunique"),
        evictions=("evicted", "nunique"),
        ranks=("rank", lambda s: ", ".join(str(r) for r in sorted(set(s)))),
        kinds=("kinds", lambda s: ", ".join(sorted({k for kinds in s for k in kinds}))),
        last_run=("order", "min"),
    )
    per_host["last_run"] = [list(ledgers)[i] for i in per_host["last_run"]]
    ordered = per_host.sort_values(["evictions", "incidents", "runs"], ascending=False).reset_index()
    return ordered[LEDGER_COLUMNS]


def concentration(ledger: pd.DataFrame, hosts_seen: int) -> str | None:
    """How few hosts account for half of the evictions (of the incidents, when none suggests an eviction), out of
    ``hosts_seen`` across the runs; None when no incident names a host."""
    counted, what = ("evictions", "evictions") if ledger["evictions"].sum() > 0 else ("incidents", "incidents")
    counts = ledger[counted].sort_values(ascending=False).to_numpy()
    total = counts.sum() if len(counts) else 0
    if total == 0:
        return None
    few = int((counts.cumsum() < total / 2).sum()) + 1
    return f"{few} of {max(hosts_seen, len(ledger))} hosts account for half of all {what} ({int(total)})"
