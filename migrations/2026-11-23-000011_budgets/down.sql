DROP INDEX task_runs_finished;
ALTER TABLE tasks DROP COLUMN budget_reserve_nanos;
ALTER TABLE tasks DROP COLUMN blocked_at;
ALTER TABLE tasks DROP COLUMN blocked_by;
ALTER TABLE repositories DROP COLUMN monthly_budget_nanos;
DROP TABLE instance_budget;
