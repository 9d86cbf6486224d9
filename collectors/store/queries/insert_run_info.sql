-- One row for run.json (its topology goes to rank_topology via insert_topology),
-- with the problems of the fields it left out.
INSERT INTO run_info SELECT $run_id, $name, $created, $schema_version, $world_size, $config::JSON, $raw::JSON,
                            $problems::VARCHAR[];
