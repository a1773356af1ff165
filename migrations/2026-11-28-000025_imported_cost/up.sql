-- Imported cost: the part of the cumulative cost that is imported history (tasks from
-- `agentry import`, docs/contract.md#39-import). The cost report's `forecast` gains
-- `monthImportedCostSoFar` (docs/contract.md#42-members), so the Costs page can say how much
-- of the month no budget counts. A running total like the other columns: the recorded cost of
-- the combination's imported tasks created on or before the row's day.
ALTER TABLE cost_cumulative ADD COLUMN imported_cost_nanos BIGINT NOT NULL DEFAULT 0;

-- Backfill from the existing imported tasks. First each combination's day; timestamps are
-- stored in UTC and their text form starts with YYYY-MM-DD on both backends (SQLite's stored
-- text; PostgreSQL's ISO output).
CREATE TABLE imported_backfill_daily (
    repo_url TEXT NOT NULL,
    task_type TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    cost_nanos BIGINT NOT NULL,
    PRIMARY KEY (repo_url, task_type, model, day)
);
INSERT INTO imported_backfill_daily
SELECT t.repo_url, t.task_type, COALESCE(t.model_used, ''),
       SUBSTR(CAST(t.created_at AS TEXT), 1, 10),
       CAST(SUM(t.cost_nanos) AS BIGINT)
FROM tasks t
WHERE t.imported AND t.cost_nanos IS NOT NULL
GROUP BY t.repo_url, t.task_type, COALESCE(t.model_used, ''),
         SUBSTR(CAST(t.created_at AS TEXT), 1, 10);

-- Then running totals over each combination's dense rows.
CREATE TABLE imported_backfill AS
SELECT c.repo_url, c.task_type, c.model, c.day,
       CAST(SUM(COALESCE(d.cost_nanos, 0)) OVER w AS BIGINT) AS cost_nanos
FROM cost_cumulative c
LEFT JOIN imported_backfill_daily d
       ON d.repo_url = c.repo_url AND d.task_type = c.task_type AND d.model = c.model
      AND d.day = c.day
WINDOW w AS (PARTITION BY c.repo_url, c.task_type, c.model ORDER BY c.day
             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);
CREATE UNIQUE INDEX imported_backfill_key ON imported_backfill (repo_url, task_type, model, day);

UPDATE cost_cumulative SET
    imported_cost_nanos = (SELECT b.cost_nanos FROM imported_backfill b
        WHERE b.repo_url = cost_cumulative.repo_url AND b.task_type = cost_cumulative.task_type
          AND b.model = cost_cumulative.model AND b.day = cost_cumulative.day);

DROP TABLE imported_backfill;
DROP TABLE imported_backfill_daily;
