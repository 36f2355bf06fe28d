-- Completeness (`expect_count`): the total of records the source declared
-- for the period, next to `rows_read`. `_tm_runs.rows_expected` came with
-- migration 0002; each attempt now records it too. NULL when the source
-- declares none (and for every attempt before this).
ALTER TABLE _tm_attempts ADD COLUMN rows_expected INTEGER;
