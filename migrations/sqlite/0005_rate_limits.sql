-- Nothing to do on SQLite: the rate limit of a source stays the in-process
-- bucket, because one process owns a SQLite file (ADR 0010). This file
-- keeps both migration folders numbered alike.
SELECT 1;
