-- The repository setting allowProviderTools (docs/contract.md#35-repository-settings): whether
-- the model gateway passes on calls that ask the provider to reach out on the agent's behalf
-- (MCP servers, server-side web fetch and search, code execution, ...). Off for every
-- repository, existing ones included.
ALTER TABLE repositories ADD COLUMN allow_provider_tools BOOLEAN NOT NULL DEFAULT FALSE;
