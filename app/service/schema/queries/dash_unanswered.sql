-- Dashboard: the control requests an open unanswered_request finding says were not applied, and why.
SELECT evidence ->> 'request_id' AS request_id, summary
FROM findings
WHERE kind = 'unanswered_request' AND active;
