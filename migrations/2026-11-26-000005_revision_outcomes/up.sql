-- Revision outcomes: the cost report's `outcomes` gains `revisionCost` and
-- `avgRevisionsPerMergedPullRequest` (docs/analytics.md, docs/contract.md#57-revisions).

-- What the task's revision runs cost (runs whose trigger is 'revision'), in nano-dollars;
-- part of `cost_nanos`, which sums every run. Added to by each recorded revision run.
ALTER TABLE tasks ADD COLUMN revision_cost_nanos BIGINT NOT NULL DEFAULT 0;

-- Running totals like the other outcome columns, over the units whose head was created on
-- or before the row's day: the revision rounds of merged heads (`tasks.revisions` of coding
-- heads in 'completed'), and what the revision runs of the units cost (every class).
ALTER TABLE cost_cumulative ADD COLUMN merged_revisions BIGINT NOT NULL DEFAULT 0;
ALTER TABLE cost_cumulative ADD COLUMN revision_cost_nanos BIGINT NOT NULL DEFAULT 0;

-- No backfill: revisions are new in this release (2026-11-26-000004_revisions), so no task
-- has a revision round or a revision run yet and 0 is every existing row's true value.
