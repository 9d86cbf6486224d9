-- Control requests filed through bedside, from the audit trail (RUN/control/audit.jsonl): the owner copies
-- each entry that filed one, once, when it checks the trail. Against the loop's answers (actions), a request
-- that was filed and never answered shows (its file removed or hidden, or no loop reads requests).

CREATE SEQUENCE filed_order;

CREATE TABLE filed_requests (
    request_id VARCHAR PRIMARY KEY,
    filed_at   DOUBLE NOT NULL,      -- the audit entry's time (unix seconds)
    action     VARCHAR NOT NULL,
    operator   VARCHAR,
    reason     VARCHAR,
    args       JSON,
    audit_seq  BIGINT NOT NULL,      -- the entry's line in the trail
    recorded   BIGINT NOT NULL DEFAULT nextval('filed_order')  -- copy order: what the detectors' feed reads past
);

-- Every control request, filed through bedside or only seen answered, with its latest answer; 'not answered'
-- while the loop has said nothing of it (the unanswered_request detector says when that is a problem).
CREATE OR REPLACE VIEW control_requests AS
WITH answers AS (
    SELECT request_id, arg_max(status, time) AS status, any_value(action) AS action, any_value(operator) AS operator,
           any_value(reason) AS reason, any_value(args) AS args,
           min(time) FILTER (WHERE status = 'requested') AS taken_at, max(time) AS answered_at,
           arg_max(step, time) AS step, arg_max(timeline, time) AS timeline, arg_max(message, time) AS message
    FROM actions
    GROUP BY request_id
)
SELECT request_id,
       coalesce(a.status, 'not answered') AS status,
       coalesce(f.action, a.action) AS action,
       coalesce(f.operator, a.operator) AS operator,
       coalesce(f.reason, a.reason) AS reason,
       coalesce(f.args, a.args) AS args,
       f.filed_at,
       a.taken_at,
       coalesce(a.answered_at, f.filed_at) AS updated_at,
       a.step,
       a.timeline,
       a.message
FROM filed_requests f FULL OUTER JOIN answers a USING (request_id);
