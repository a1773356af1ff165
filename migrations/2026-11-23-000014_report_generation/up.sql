-- The cost report's generation: a number raised by every transaction that writes the rollups
-- or a task's contribution to them (crates/persistence/src/rollups.rs `apply`), committed with
-- that write. A process that keeps a computed report serves it again only while this number
-- and the budget settings are unchanged, so every replica sees a write at once.
CREATE TABLE report_generation (
    id INTEGER PRIMARY KEY,
    generation BIGINT NOT NULL
);
INSERT INTO report_generation (id, generation) VALUES (1, 0);
