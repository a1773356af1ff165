-- Revisions (docs/contract.md#57-revisions): review feedback on a pull request agentry opened
-- sends the coding agent back to the same pull request.

-- Every review, comment or review comment that asked for changes, once per code-host id
-- (redeliveries, the poller and the webhook, replicas and restarts all land on the key).
-- `round_attempt` is the attempt of the revision round that took it (null while it waits);
-- `outcome` is `waiting`, `taken`, `over_limit` (the repository's maxRevisions was reached)
-- or `dropped` (the pull request was closed or merged first).
CREATE TABLE revision_feedback (
    repo_id TEXT NOT NULL,
    source TEXT NOT NULL,
    external_id TEXT NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks (id),
    pr_number BIGINT NOT NULL,
    author TEXT NOT NULL,
    body TEXT NOT NULL,
    path TEXT,
    line BIGINT,
    url TEXT NOT NULL,
    received_at TIMESTAMP NOT NULL,
    round_attempt INTEGER,
    outcome TEXT NOT NULL DEFAULT 'waiting',
    PRIMARY KEY (repo_id, source, external_id)
);
CREATE INDEX revision_feedback_task ON revision_feedback (task_id, outcome, received_at);

-- A task's revision rounds: how many started, the first attempt of the latest one, and when
-- the next may start (the end of the quiet period after the last feedback; null when none
-- waits).
ALTER TABLE tasks ADD COLUMN revisions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN revision_attempt INTEGER;
ALTER TABLE tasks ADD COLUMN revision_due_at TIMESTAMP;
CREATE INDEX tasks_revision_due ON tasks (revision_due_at) WHERE revision_due_at IS NOT NULL;

-- Why each run happened: `assignment`, `retry` or `revision` (with the feedback that
-- started the round: its URL and author).
ALTER TABLE task_runs ADD COLUMN run_trigger TEXT NOT NULL DEFAULT 'assignment';
ALTER TABLE task_runs ADD COLUMN trigger_url TEXT;
ALTER TABLE task_runs ADD COLUMN trigger_author TEXT;

-- The repository settings maxRevisions and reviseOnAgentReview.
ALTER TABLE repositories ADD COLUMN max_revisions INTEGER NOT NULL DEFAULT 3;
ALTER TABLE repositories ADD COLUMN revise_on_agent_review BOOLEAN NOT NULL DEFAULT FALSE;
