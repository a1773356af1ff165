-- Whether an agent run ran inside the sandbox (SPEC §10.3): false for runs of a service
-- started with AGENTRY_AGENT_SANDBOX=off, null where it is not known (runs recorded before
-- this column existed, and runs recovered after their service died).
ALTER TABLE task_runs ADD COLUMN sandboxed BOOLEAN;
