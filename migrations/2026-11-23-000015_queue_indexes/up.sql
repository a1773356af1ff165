-- Imported tasks are history (docs/contract.md#39-import): the runner never claims one, even
-- in `queued` (an import carries no prompt), and a retry of one is refused. Tasks imported
-- before this column existed are found by their `imported` event.
ALTER TABLE tasks ADD COLUMN imported BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE tasks SET imported = TRUE
WHERE id IN (SELECT task_id FROM task_events WHERE reason = 'imported');

-- The runner's queue: queued tasks the service created, oldest first. A claim reads it from
-- the start, however many imported tasks sit in `queued` (crates/persistence/src/runner.rs).
CREATE INDEX tasks_queue ON tasks (created_at, id) WHERE state = 'queued' AND NOT imported;

-- The tasks a monthly budget blocked (crates/persistence/src/budgets.rs). When money may be
-- available again (after every run) they are found through this index, not by reading every
-- queued task: a backlog of 100,000 queued tasks made each run's end a scan of all of them.
CREATE INDEX tasks_blocked ON tasks (blocked_at) WHERE blocked_at IS NOT NULL;
