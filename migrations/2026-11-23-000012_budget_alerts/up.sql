-- Budget alerts (docs/contract.md#67-budgets): one row per budget, month and threshold, which
-- the unique key makes exactly one however many replicas (or restarts) find the threshold
-- reached. The row is also the alert's outbox entry for the optional outbound webhook:
-- 'pending' rows are claimed with a lease (next_attempt_at moved forward), retried with
-- backoff and marked 'delivered'; 'unsent' rows were recorded while no webhook was set.
CREATE TABLE budget_alerts (
    id TEXT PRIMARY KEY,
    -- 'instance', or the repository's id.
    budget_key TEXT NOT NULL,
    scope TEXT NOT NULL,
    repo_id TEXT,
    repo_url TEXT,
    -- 'YYYY-MM' (UTC).
    month TEXT NOT NULL,
    -- 50, 80 or 100 (percent).
    threshold INTEGER NOT NULL,
    spent_nanos BIGINT NOT NULL,
    budget_nanos BIGINT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    delivery TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    next_attempt_at TIMESTAMP NOT NULL,
    delivered_at TIMESTAMP,
    last_error TEXT
);
CREATE UNIQUE INDEX budget_alerts_once ON budget_alerts (budget_key, month, threshold);
CREATE INDEX budget_alerts_created ON budget_alerts (created_at, id);
CREATE INDEX budget_alerts_due ON budget_alerts (delivery, next_attempt_at);
