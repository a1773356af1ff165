-- The repository setting egressAllow (docs/contract.md#35-repository-settings): the host
-- patterns its sandboxed agents may reach through the egress proxy, as a JSON array of
-- normalised strings.
ALTER TABLE repositories ADD COLUMN egress_allow TEXT NOT NULL DEFAULT '[]';
