-- Monthly budgets (docs/contract.md#67-budgets). The instance-wide budget is one row; a
-- repository's is a column of its settings. Money is nano-dollars, as everywhere.
CREATE TABLE instance_budget (
    id INTEGER PRIMARY KEY,
    monthly_budget_nanos BIGINT,
    updated_at TIMESTAMP NOT NULL
);
INSERT INTO instance_budget (id, monthly_budget_nanos, updated_at)
VALUES (1, NULL, CURRENT_TIMESTAMP);

ALTER TABLE repositories ADD COLUMN monthly_budget_nanos BIGINT;

-- A queued task no budget can pay for: which budget ('repository' or 'instance') and when
-- it was found so. It is a candidate again in a later month, or when money is freed.
ALTER TABLE tasks ADD COLUMN blocked_by TEXT;
ALTER TABLE tasks ADD COLUMN blocked_at TIMESTAMP;
-- What a claimed run may spend at most (its share of the budgets it counts against),
-- reserved while the task is provisioning or running.
ALTER TABLE tasks ADD COLUMN budget_reserve_nanos BIGINT;

-- Month-to-date spend is the sum of the runs finished since the month began.
CREATE INDEX task_runs_finished ON task_runs (finished_at);
