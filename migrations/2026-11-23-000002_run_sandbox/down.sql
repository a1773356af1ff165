ALTER TABLE task_runs DROP COLUMN sandboxed;
