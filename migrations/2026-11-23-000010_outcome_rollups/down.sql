ALTER TABLE cost_cumulative DROP COLUMN failed_cost_nanos;
ALTER TABLE cost_cumulative DROP COLUMN merged_cost_nanos;
ALTER TABLE cost_cumulative DROP COLUMN outcome_cost_nanos;
ALTER TABLE cost_cumulative DROP COLUMN outcome_costed;
ALTER TABLE cost_cumulative DROP COLUMN outcome_merged;
