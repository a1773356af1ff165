-- Lost runs' cost in their month (docs/contract.md#67-budgets). A run recorded without an
-- end time (`lost`: its replica died, or the service stopped, while it ran) had its cost
-- summed under month '' in `run_cost_rollup`, which no budget, alert or month's spend reads:
-- that money was neither held nor spent. Such a run now counts in the month it started.
-- The rollup is derived data: rebuilt here from the run ledger, as its first migration
-- (000003_metrics_rollups) built it, with that one rule changed. Timestamps are stored in
-- UTC and their text form starts with YYYY-MM on both backends.
DELETE FROM run_cost_rollup;
INSERT INTO run_cost_rollup (month, repo_id, repo_url, task_type, model, cost_nanos)
SELECT
    SUBSTR(CAST(COALESCE(r.finished_at, r.started_at) AS TEXT), 1, 7),
    COALESCE(t.repo_id, ''),
    t.repo_url,
    t.task_type,
    COALESCE(r.model, ''),
    SUM(r.cost_nanos)
FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.cost_nanos IS NOT NULL
GROUP BY 1, 2, 3, 4, 5;
