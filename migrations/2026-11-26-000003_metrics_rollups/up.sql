-- Rollups that `/metrics` reads instead of scanning the run ledger at every scrape
-- (docs/contract.md#311-metrics). Both are maintained in the transaction that records the
-- run (crates/persistence/src/tasks.rs `record_run`) or the refused connection
-- (crates/persistence/src/metering.rs `record_blocked`).

-- The recorded cost of agent runs with a cost, summed per month the run finished in
-- (`YYYY-MM` UTC, '' when it has no finish time), task's repository (id, '' when none;
-- and URL), task type and run model ('' = unknown).
CREATE TABLE run_cost_rollup (
    month TEXT NOT NULL,
    repo_id TEXT NOT NULL,
    repo_url TEXT NOT NULL,
    task_type TEXT NOT NULL,
    model TEXT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    PRIMARY KEY (month, repo_id, repo_url, task_type, model)
);
INSERT INTO run_cost_rollup (month, repo_id, repo_url, task_type, model, cost_nanos)
SELECT
    CASE WHEN r.finished_at IS NULL THEN '' ELSE SUBSTR(CAST(r.finished_at AS TEXT), 1, 7) END,
    COALESCE(t.repo_id, ''),
    t.repo_url,
    t.task_type,
    COALESCE(r.model, ''),
    SUM(r.cost_nanos)
FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.cost_nanos IS NOT NULL
GROUP BY 1, 2, 3, 4, 5;

-- Connections the egress proxy refused, summed per repository URL of the task.
CREATE TABLE egress_blocked_repo (
    repo_url TEXT PRIMARY KEY NOT NULL,
    count BIGINT NOT NULL
);
INSERT INTO egress_blocked_repo (repo_url, count)
SELECT t.repo_url, SUM(e.count)
FROM egress_blocked e JOIN tasks t ON t.id = e.task_id
GROUP BY t.repo_url;
