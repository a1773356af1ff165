ALTER TABLE repositories DROP COLUMN egress_allow;
