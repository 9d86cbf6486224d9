-- The ground truth to score detectors against (detectors/scoring.py): every fault_injected record, by timeline.
SELECT timeline, step, fault, target_ranks, args FROM fault_labels ORDER BY step, timeline;
