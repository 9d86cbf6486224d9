-- Dashboard: the rows of a timeline's rank heatmap (dash_rank_heatmap), in its order: every rank with steps on the
-- timeline by host, then mesh coordinates (a rank that declared no place last), with its place.
SELECT rank, r.host, r.dp, r.tp, r.pp
FROM (SELECT DISTINCT rank FROM rank_steps WHERE timeline = $timeline) LEFT JOIN ranks r USING (rank)
ORDER BY r.host, r.pp, r.tp, r.dp, rank;
