-- The parse tree of a console query as JSON (an error object for anything but SELECT statements).
SELECT json_serialize_sql(?)
