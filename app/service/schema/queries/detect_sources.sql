SELECT source_id, committed_offset FROM sources;
