"""The MySQL/MariaDB source: the binlog (ROW format, FULL images) for the log, keyset chunks for
dumps, with PyMySQL for queries and the binlog's replication protocol."""
