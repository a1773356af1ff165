DROP INDEX synced_issues_repo_view;
DROP INDEX synced_issues_view;
CREATE INDEX synced_issues_state ON synced_issues (state, updated_at);
ALTER TABLE synced_issues DROP COLUMN linked;
