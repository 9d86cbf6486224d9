-- The newest migration applied per namespace, of a store from before namespaces (numbered as adopt_namespaces.sql
-- renumbers them: 3 to 5 are the service's 1 to 3, the rest the telemetry's).
SELECT CASE WHEN version BETWEEN 3 AND 5 THEN 'service' ELSE 'telemetry' END AS namespace,
       max(CASE WHEN version BETWEEN 3 AND 5 THEN version - 2 ELSE version END)
FROM schema_migrations
GROUP BY namespace
