-- Cost rollups: what the cost report reads instead of the task table, maintained in the same
-- transaction as every change to a task's cost, state, model or existence (docs/analytics.md).
-- Days are 'YYYY-MM-DD' text (UTC calendar days of the task's creation).

-- Per day and repository: all tasks, costed tasks, exact cost. Feeds the daily series.
CREATE TABLE cost_daily (
    day TEXT NOT NULL,
    repo_url TEXT NOT NULL,
    tasks BIGINT NOT NULL,
    costed BIGINT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    PRIMARY KEY (day, repo_url)
);

-- Running totals per (repository, task type, model): the row of day D holds the sums over
-- the combination's tasks created on or before D. Every combination has a row for every day
-- from its first task through the latest rolled-up day, so the sums of any window are two
-- equality lookups per combination. model '' = unknown.
CREATE TABLE cost_cumulative (
    repo_url TEXT NOT NULL,
    task_type TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    tasks BIGINT NOT NULL,
    costed BIGINT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    succeeded BIGINT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    PRIMARY KEY (repo_url, task_type, model, day)
);
CREATE INDEX cost_cumulative_day ON cost_cumulative (day);

-- The costliest tasks (topTasks) and anomaly candidates, read top-down in exactly the
-- report's order (cost desc, created_at desc, id), so no query sorts a period's rows.
CREATE INDEX tasks_cost ON tasks (cost_nanos DESC, created_at DESC, id) WHERE cost_nanos IS NOT NULL;
CREATE INDEX tasks_repo_cost ON tasks (repo_url, cost_nanos DESC, created_at DESC, id) WHERE cost_nanos IS NOT NULL;
