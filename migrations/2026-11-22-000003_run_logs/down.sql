DROP INDEX tasks_lease;
DROP TABLE run_logs;
