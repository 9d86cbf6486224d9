SELECT max(world_size) AS world_size FROM run_info;
