"""`dblog demo`: DBLog end to end on private servers, nothing to set up. One story
(`story.py`), told on PostgreSQL (`postgres.py`: the target is a second database, written by
the SQL-apply output) or on MariaDB (`mariadb.py`: the target is the NDJSON stream, replayed,
as the SQL-apply output writes PostgreSQL)."""
