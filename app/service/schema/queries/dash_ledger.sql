-- The ledger across runs (docs/dashboard.md, "Hosts in incidents"): each rank an incident names, with its host and
-- whether the incident's suggestion is to evict it (its host, or the rank itself).
SELECT i.incident_id, i.severity, i.status, i.kinds, i.timeline, i.start_step, u.rank, r.host,
       i.suggested_action ->> 'action' = 'evict' AS evict
FROM incidents i, unnest(i.ranks) AS u(rank)
LEFT JOIN ranks r ON r.rank = u.rank
ORDER BY i.incident_id, u.rank;
