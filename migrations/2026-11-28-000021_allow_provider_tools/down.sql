ALTER TABLE repositories DROP COLUMN allow_provider_tools;
