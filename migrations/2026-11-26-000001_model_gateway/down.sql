ALTER TABLE task_events DROP COLUMN kind;
ALTER TABLE task_runs DROP COLUMN reported_cost_nanos;
ALTER TABLE task_runs DROP COLUMN model_calls;
DROP TABLE egress_blocked;
DROP TABLE model_calls;
