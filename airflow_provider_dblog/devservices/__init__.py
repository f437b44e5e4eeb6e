"""Real PostgreSQL, MariaDB and Redis servers for tests, the demo and development, without Docker.

One module per server, all built on `process.ServerProcess`: `start()` returns once the server
answers a real query, `stop()` shuts it down (SIGKILL after a grace period), `restart()` and
`kill()` serve the crash tests, and `info` holds what callers need to connect. `stack` runs the
three as one set for `dblog dev-services up/down/status`. `pg_replica` and `mariadb_replica` start
a streaming replica beside a running primary, driven through the calls in `replica`. `tls`
makes a throwaway CA whose certificates let PostgreSQL and MariaDB require TLS (`tls=`).
"""
