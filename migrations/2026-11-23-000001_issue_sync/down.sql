ALTER TABLE repositories DROP COLUMN issues_full_synced_at;
ALTER TABLE repositories DROP COLUMN issues_watermark;
