//! Foundation behaviour: file sources into SQLite and PostgreSQL.
