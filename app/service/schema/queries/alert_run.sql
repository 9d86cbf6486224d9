SELECT run_id, name FROM run_info LIMIT 1;
