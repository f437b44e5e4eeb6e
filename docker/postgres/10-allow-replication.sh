#!/bin/sh
# Run once by the postgres image's entrypoint when it creates the database: let the tailers'
# replication connections in from the stack's network, with a password, as the image already
# does for ordinary connections ("all" in pg_hba.conf does not cover replication).
set -e
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
