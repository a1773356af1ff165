-- The model gateway (docs/contract.md#68-model-gateway): every model call of a sandboxed run,
-- as the gateway metered it, written as the call finishes (so a crash or a recovery by another
-- replica loses none). Tokens as the provider reported them, uncached input apart; the cost is
-- priced from the price table at that moment (null when the model has no price).
CREATE TABLE model_calls (
    id TEXT PRIMARY KEY NOT NULL,
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt INTEGER NOT NULL,
    provider TEXT NOT NULL,
    model TEXT,
    status INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL,
    cache_write_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    reasoning_tokens BIGINT NOT NULL,
    cost_nanos BIGINT,
    started_at TIMESTAMP NOT NULL,
    duration_ms BIGINT NOT NULL
);
CREATE INDEX model_calls_run ON model_calls (task_id, attempt, started_at);

-- Connections the egress proxy refused, per run and destination.
CREATE TABLE egress_blocked (
    task_id TEXT NOT NULL REFERENCES tasks (id),
    attempt INTEGER NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    count BIGINT NOT NULL,
    first_at TIMESTAMP NOT NULL,
    last_at TIMESTAMP NOT NULL,
    PRIMARY KEY (task_id, attempt, host, port)
);

-- A metered run: how many model calls the gateway saw (null for a run that did not go
-- through it), and what the agent itself printed as its cost, kept beside the metered one.
ALTER TABLE task_runs ADD COLUMN model_calls BIGINT;
ALTER TABLE task_runs ADD COLUMN reported_cost_nanos BIGINT;

-- Events that are not state changes (such as `cost_mismatch`) share the task's history.
ALTER TABLE task_events ADD COLUMN kind TEXT NOT NULL DEFAULT 'transition';
