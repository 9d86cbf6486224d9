-- run.json's per-rank placement (the registered Arrow table run_topology).
INSERT INTO rank_topology SELECT * FROM run_topology;
