DROP INDEX tasks_blocked;
DROP INDEX tasks_queue;
ALTER TABLE tasks DROP COLUMN imported;
