DROP INDEX tasks_repo_cost;
DROP INDEX tasks_cost;
DROP TABLE cost_cumulative;
DROP TABLE cost_daily;
