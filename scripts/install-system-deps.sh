#!/usr/bin/env bash
# Install the Debian 12 packages that the real-server tests, the demo and development need:
#   postgresql-15            PostgreSQL 15 server binaries (/usr/lib/postgresql/15/bin)
#   mariadb-server           mariadbd and mariadb-install-db
#   redis-server             redis-server
#   redis-sentinel           redis-sentinel: the Sentinel group of the failover tests and
#                            `dblog demo --redis-ha` (devservices/redis_sentinel.py)
#   openjdk-17-jre-headless  Java for Spark
#   libpostgresql-jdbc-java  PostgreSQL JDBC driver (/usr/share/java/postgresql.jar), for the
#                            Spark JDBC read that bench/bench_spark_dump.py compares with ours
#   sysbench                 the sustained write load of bench/bench_sustained.py and of the
#                            MariaDB tailer's kill test (a load generator no one here wrote)
#   percona-toolkit          pt-table-checksum and pt-table-sync: MySQL users' reference check,
#                            which bench/bench_verify.py runs on MariaDB beside `dblog verify`
#   chromium                 a headless browser for the test of Airflow's trigger forms
#                            (driven through its DevTools protocol; nothing downloads another)
#   prometheus               /usr/bin/prometheus and /usr/bin/promtool: the checks and unit tests
#                            of docker/prometheus/ (alert rules, scrape configuration) and the
#                            test that scrapes a real tailer with the real server
#   gcc, python3.11-dev      the C compiler and headers that build the PostgreSQL log reader's
#                            hot path with mypyc (scripts/compile.py)
# The tests start their own servers (airflow_provider_dblog/devservices); the system services
# are not needed, so they are kept from starting during installation.
#
# Idempotent and quick when everything is installed. As root it installs what is missing;
# as another user it lists what is missing and the command to run, and exits 1.
set -euo pipefail

PACKAGES=(postgresql-15 mariadb-server redis-server redis-sentinel openjdk-17-jre-headless
    libpostgresql-jdbc-java sysbench percona-toolkit chromium prometheus gcc python3.11-dev)

missing=()
for package in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$package")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "system packages: all installed (${PACKAGES[*]})"
    exit 0
fi

install_command="apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${missing[*]}"

if [[ "$(id -u)" -ne 0 ]]; then
    echo "missing Debian packages: ${missing[*]}" >&2
    echo "install them as root:" >&2
    echo "  sudo sh -c '${install_command}'" >&2
    echo "or run this script as root: sudo $0" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null; then
    echo "apt-get not found: install ${missing[*]} with your system's package manager" >&2
    exit 1
fi

# Keep the packages' own services (ports 5432, 3306, 6379, 9090) from starting: policy-rc.d
# answering 101 is Debian's switch for that. Leave an existing policy alone.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi

echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "system packages: installed ${missing[*]}"
