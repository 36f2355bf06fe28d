-- The batch a resumed attempt continued from (the run's committed batches
-- when it was claimed); NULL for an attempt that started the period from
-- its first batch. `status --period` tells a period's story from it
-- ("attempt 2 resumed from batch 41"); `resumed` alone said only that.
ALTER TABLE _tm_attempts ADD COLUMN from_batch INTEGER;
