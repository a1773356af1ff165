ALTER TABLE cost_cumulative DROP COLUMN revision_cost_nanos;
ALTER TABLE cost_cumulative DROP COLUMN merged_revisions;
ALTER TABLE tasks DROP COLUMN revision_cost_nanos;
