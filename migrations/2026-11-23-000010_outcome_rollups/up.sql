-- Outcome rollups: the cost report's `outcomes` member (docs/analytics.md) read from the
-- cumulative rows. An outcome unit is a coding task with its review subtasks; each task of a
-- unit counts in the (repository, task type, model) combination and day of the unit's head
-- (its coding task; a task without a coding parent is its own head), in the class the head
-- ended in. Columns hold running totals like the others: units whose head was created on or
-- before the row's day.
ALTER TABLE cost_cumulative ADD COLUMN outcome_merged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cost_cumulative ADD COLUMN outcome_costed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cost_cumulative ADD COLUMN outcome_cost_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cost_cumulative ADD COLUMN merged_cost_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cost_cumulative ADD COLUMN failed_cost_nanos BIGINT NOT NULL DEFAULT 0;

-- Backfill from the existing tasks. First each head's day: merged pull requests (coding
-- heads in 'completed'), costed tasks, cost, and the cost of merged and of failed/cancelled
-- units. Timestamps are stored in UTC; their text form starts with YYYY-MM-DD on both
-- backends (SQLite's stored text; PostgreSQL's ISO output).
CREATE TABLE outcome_backfill_daily (
    repo_url TEXT NOT NULL,
    task_type TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    merged BIGINT NOT NULL,
    costed BIGINT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    merged_cost_nanos BIGINT NOT NULL,
    failed_cost_nanos BIGINT NOT NULL,
    PRIMARY KEY (repo_url, task_type, model, day)
);
INSERT INTO outcome_backfill_daily
SELECT h.repo_url, h.task_type, COALESCE(h.model_used, ''),
       SUBSTR(CAST(h.created_at AS TEXT), 1, 10),
       CAST(SUM(CASE WHEN t.id = h.id AND h.task_type = 'coding' AND h.state = 'completed'
                     THEN 1 ELSE 0 END) AS BIGINT),
       CAST(COUNT(t.cost_nanos) AS BIGINT),
       CAST(COALESCE(SUM(t.cost_nanos), 0) AS BIGINT),
       CAST(COALESCE(SUM(CASE WHEN h.task_type = 'coding' AND h.state = 'completed'
                              THEN t.cost_nanos ELSE 0 END), 0) AS BIGINT),
       CAST(COALESCE(SUM(CASE WHEN h.state IN ('failed', 'cancelled')
                              THEN t.cost_nanos ELSE 0 END), 0) AS BIGINT)
FROM tasks t
LEFT JOIN tasks p
       ON t.task_type = 'review' AND p.id = t.parent_task_id AND p.task_type = 'coding'
JOIN tasks h ON h.id = COALESCE(p.id, t.id)
GROUP BY h.repo_url, h.task_type, COALESCE(h.model_used, ''),
         SUBSTR(CAST(h.created_at AS TEXT), 1, 10);

-- Then running totals over each combination's dense rows.
CREATE TABLE outcome_backfill AS
SELECT c.repo_url, c.task_type, c.model, c.day,
       CAST(SUM(COALESCE(d.merged, 0)) OVER w AS BIGINT) AS merged,
       CAST(SUM(COALESCE(d.costed, 0)) OVER w AS BIGINT) AS costed,
       CAST(SUM(COALESCE(d.cost_nanos, 0)) OVER w AS BIGINT) AS cost_nanos,
       CAST(SUM(COALESCE(d.merged_cost_nanos, 0)) OVER w AS BIGINT) AS merged_cost_nanos,
       CAST(SUM(COALESCE(d.failed_cost_nanos, 0)) OVER w AS BIGINT) AS failed_cost_nanos
FROM cost_cumulative c
LEFT JOIN outcome_backfill_daily d
       ON d.repo_url = c.repo_url AND d.task_type = c.task_type AND d.model = c.model
      AND d.day = c.day
WINDOW w AS (PARTITION BY c.repo_url, c.task_type, c.model ORDER BY c.day
             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);
CREATE UNIQUE INDEX outcome_backfill_key ON outcome_backfill (repo_url, task_type, model, day);

UPDATE cost_cumulative SET
    outcome_merged = (SELECT b.merged FROM outcome_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day),
    outcome_costed = (SELECT b.costed FROM outcome_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day),
    outcome_cost_nanos = (SELECT b.cost_nanos FROM outcome_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day),
    merged_cost_nanos = (SELECT b.merged_cost_nanos FROM outcome_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day),
    failed_cost_nanos = (SELECT b.failed_cost_nanos FROM outcome_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day);

DROP TABLE outcome_backfill;
DROP TABLE outcome_backfill_daily;
