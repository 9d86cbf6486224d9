-- One row for run.json (its topology goes to rank_topology via insert_topology).
INSERT INTO run_info SELECT $run_id, $name, $created, $schema_version, $world_size, $config::JSON, $raw::JSON;
