-- bedside demo: what was injected, where and when (the ground truth detectors are scored against).
SELECT step, fault, target_ranks, args ->> 'spec' AS spec FROM fault_labels ORDER BY step;
