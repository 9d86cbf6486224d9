SELECT rank, host, local_rank, dp, tp, pp FROM ranks ORDER BY rank;
