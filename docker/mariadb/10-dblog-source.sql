-- Makes the compose stack's MariaDB a DBLog source, run once by the image's entrypoint when it
-- creates the database. The entrypoint has already created the user `dblog` (MARIADB_USER,
-- password from MARIADB_PASSWORD) with every right on its own database `dblog` (MARIADB_DATABASE),
-- where the tailer keeps its watermark table. Here: the demo table, and what `dblog` may do
-- beyond its own database (docs/operations.md, "Least-privilege roles"): read the captured
-- tables and the binlog, nothing else.
CREATE DATABASE shop;
CREATE TABLE shop.accounts (
    id bigint PRIMARY KEY,
    owner varchar(100) NOT NULL,
    balance decimal(12, 2),
    active boolean,
    updated timestamp(6) DEFAULT CURRENT_TIMESTAMP(6)
);
INSERT INTO shop.accounts (id, owner, balance, active)
SELECT seq, CONCAT('owner-', seq), seq * 1.5, seq % 3 > 0 FROM seq_1_to_10000;

GRANT SELECT ON shop.* TO 'dblog'@'%';
GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'dblog'@'%';
