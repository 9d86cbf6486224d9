-- bedside demo: the incidents the detectors opened, in order, with what they suggest.
SELECT start_step, end_step, severity, status, array_to_string(kinds, ',') AS kinds,
       array_to_string(ranks, ',') AS ranks, suggested_action ->> 'action' AS action, summary
FROM incidents
ORDER BY timeline, start_step;
