-- The issues view's order in an index (docs/contract.md#36-issues-view: issues with no linked
-- task first, then `updated_at` descending), so that a page is a range read instead of a sort
-- of every open issue. `linked` says whether an `issue_links` row exists for the issue; it is
-- set when the link is written (links are never removed) and when an issue enters the copy.
-- The last columns serve the issues that share a timestamp: their repositories are read from
-- the index alone, then each repository's by number.
ALTER TABLE synced_issues ADD COLUMN linked BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE synced_issues SET linked = TRUE
WHERE EXISTS (
    SELECT 1 FROM issue_links
    WHERE issue_links.repo_id = synced_issues.repo_id
      AND issue_links.issue_number = synced_issues.number
);
DROP INDEX synced_issues_state;
CREATE INDEX synced_issues_view ON synced_issues (state, linked, updated_at DESC, repo_id, number);
CREATE INDEX synced_issues_repo_view ON synced_issues (repo_id, state, linked, updated_at DESC, number);
