-- Dashboard: ranks ordered by host, then mesh coordinates (rows of the heatmap).
SELECT rank, host, dp, tp, pp FROM ranks ORDER BY host, pp, tp, dp, rank;
