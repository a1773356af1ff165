DROP TABLE egress_blocked_repo;
DROP TABLE run_cost_rollup;
