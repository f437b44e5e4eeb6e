"""The MySQL/MariaDB source: the binlog (ROW format, FULL images) for the log, keyset chunks for
dumps, with PyMySQL for queries and mysql-replication for the binlog."""
