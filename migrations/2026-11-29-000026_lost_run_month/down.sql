-- Back to lost runs under month '' (as 000003_metrics_rollups summed them).
DELETE FROM run_cost_rollup;
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
