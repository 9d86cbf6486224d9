-- The first lines of a staged import that the collector rejected ($limit of them), with the reason: what a
-- failed import names, its run removed with it.
SELECT path, line_offset, reason, line
FROM rejected
ORDER BY path, line_offset
LIMIT $limit;
