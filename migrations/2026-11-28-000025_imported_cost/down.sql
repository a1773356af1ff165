ALTER TABLE cost_cumulative DROP COLUMN imported_cost_nanos;
