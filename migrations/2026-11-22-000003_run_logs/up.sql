-- The agent output of each recorded run (SPEC §3.8 `GET /api/tasks/{id}/log`), kept apart from
-- the run ledger so that listing runs never reads logs. `truncated` says the head of an
-- oversized output was dropped (the end, with the final result event, is always kept).
CREATE TABLE run_logs (
    run_id TEXT PRIMARY KEY NOT NULL REFERENCES task_runs (id),
    task_id TEXT NOT NULL REFERENCES tasks (id),
    content TEXT NOT NULL,
    truncated BOOLEAN NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE INDEX run_logs_task ON run_logs (task_id, created_at);

-- Claiming reads the oldest queued task; expired leases are looked up by expiry.
CREATE INDEX tasks_lease ON tasks (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
