-- The hosts a run's ranks ran on (run.json's topology, else each rank's rank_info): the ledger's denominator.
SELECT DISTINCT host FROM ranks WHERE host IS NOT NULL ORDER BY host;
