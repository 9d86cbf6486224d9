-- run.json is ingested whole each time it changes: clear the previous copy first.
DELETE FROM run_info;
DELETE FROM rank_topology;
