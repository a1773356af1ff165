-- Incremental issue sync (SPEC §5.3): the latest `updated_at` the sync has read for the
-- repository (the next read asks for issues updated since a little before it), and when the
-- repository's open issues were last read in full (the rare safety-net read).
ALTER TABLE repositories ADD COLUMN issues_watermark TIMESTAMP;
ALTER TABLE repositories ADD COLUMN issues_full_synced_at TIMESTAMP;
