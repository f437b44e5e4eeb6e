"""A write workload in its own process, for the end-to-end tests.

    python -m tests.integration.e2e_writer postgres|mysql SEED JOURNAL STOP_FILE [PER_S]

Connects with the DSN in `$E2E_WRITER_DSN` and runs random inserts, updates and deletes on the
three sample tables of demo.py (accounts: bigint key, orders: (text, int) key, items: uuid key,
binary(16) on MySQL), 1-4 statements per transaction, until STOP_FILE exists, at most PER_S
transactions a second (default: as fast as it can). After each commit
it appends one JSON line to JOURNAL: `{"xid": N, "changes": [[table, key-as-list], ...]}` with
only the statements that changed a row, so a test can check that every committed change reached
the output. `xid` is what the events' `source.txid` holds: PostgreSQL's transaction id, and on
MariaDB the sequence number of the transaction's GTID.

Every row it writes is stamped with a version (`e2e_version`, which e2e_support adds to the
tables) from one increasing counter (a sequence on PostgreSQL, the writer's own count on MySQL):
one writer commits in version order, so in a correct output a key's version never goes down,
and a stale row shows as one that does. A row about to be deleted is stamped first, so a stale
copy of it emitted after its delete shows too.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
from psycopg.types.json import Jsonb

REGIONS = ("eu", "us", "ap", "sa")
MAX_ACCOUNT = 1500
MAX_ORDER_N = 400
NEXT = "nextval('e2e_version_seq')"
"""The next version, as SQL."""


def write_one(conn: psycopg.Connection[Any], rng: random.Random) -> tuple[str, list[Any]] | None:
    """One random statement; the (table, key) it changed, or None if it changed nothing."""
    table = rng.choice(("accounts", "orders", "items"))
    action = rng.choices(("insert", "update", "delete"), (4, 5, 2))[0]
    if table == "accounts":
        key = rng.randint(1, MAX_ACCOUNT)
        if action == "delete":
            conn.execute(f"UPDATE accounts SET e2e_version = {NEXT} WHERE id = %s", (key,))
            cur = conn.execute("DELETE FROM accounts WHERE id = %s", (key,))
        else:
            cur = conn.execute(
                "INSERT INTO accounts (id, owner, balance, active, e2e_version) "
                f"VALUES (%s, %s, %s, %s, {NEXT}) "
                "ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, "
                "active = excluded.active, updated = now(), e2e_version = excluded.e2e_version",
                (key, f"owner-{key}", round(rng.uniform(-1e4, 1e4), 2), rng.random() < 0.8),
            )
        return ("accounts", [key]) if cur.rowcount > 0 else None
    if table == "orders":
        region, n = rng.choice(REGIONS), rng.randint(1, MAX_ORDER_N)
        if action == "delete":
            conn.execute(
                f"UPDATE orders SET e2e_version = {NEXT} WHERE region = %s AND n = %s",
                (region, n),
            )
            cur = conn.execute("DELETE FROM orders WHERE region = %s AND n = %s", (region, n))
        else:
            cur = conn.execute(
                "INSERT INTO orders (region, n, amount, note, tags, e2e_version) "
                f"VALUES (%s, %s, %s, %s, %s, {NEXT}) ON CONFLICT (region, n) "
                "DO UPDATE SET amount = excluded.amount, tags = excluded.tags, "
                "e2e_version = excluded.e2e_version",
                (region, n, rng.randint(1, 10**6) / 100, f"note {n}", [region, str(n % 7)]),
            )
        return ("orders", [region, n]) if cur.rowcount > 0 else None
    if action == "insert":
        item = uuid.UUID(int=rng.getrandbits(128))
        conn.execute(
            "INSERT INTO items (id, name, attrs, blob, e2e_version) "
            f"VALUES (%s, %s, %s, %s, {NEXT})",
            (
                item,
                "item",
                Jsonb({"size": rng.randint(1, 9), "tags": ["a", "b"]}),
                rng.randbytes(8),
            ),
        )
        return "items", [str(item)]
    row = conn.execute("SELECT id FROM items ORDER BY random() LIMIT 1").fetchone()
    if row is None:
        return None
    if action == "delete":
        conn.execute(f"UPDATE items SET e2e_version = {NEXT} WHERE id = %s", row)
        cur = conn.execute("DELETE FROM items WHERE id = %s", row)
    else:
        cur = conn.execute(
            f"UPDATE items SET name = %s, e2e_version = {NEXT} WHERE id = %s",
            (f"item {rng.random()}", row[0]),
        )
    return ("items", [str(row[0])]) if cur.rowcount > 0 else None


def mysql_write_one(
    cursor: pymysql.cursors.Cursor, rng: random.Random, versions: itertools.count[int]
) -> tuple[str, list[Any]] | None:
    """`write_one` on MySQL; the items key is the base64 of its 16 bytes, as events spell it."""
    table = rng.choice(("accounts", "orders", "items"))
    action = rng.choices(("insert", "update", "delete"), (4, 5, 2))[0]
    if table == "accounts":
        key = rng.randint(1, MAX_ACCOUNT)
        if action == "delete":
            cursor.execute(
                "UPDATE accounts SET e2e_version = %s WHERE id = %s", (next(versions), key)
            )
            changed = cursor.execute("DELETE FROM accounts WHERE id = %s", (key,))
        else:
            changed = cursor.execute(
                "INSERT INTO accounts (id, owner, balance, active, e2e_version) "
                "VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE balance = VALUES(balance), "
                "active = VALUES(active), updated = CURRENT_TIMESTAMP(6), "
                "e2e_version = VALUES(e2e_version)",
                (
                    key,
                    f"owner-{key}",
                    round(rng.uniform(-1e4, 1e4), 2),
                    rng.random() < 0.8,
                    next(versions),
                ),
            )
        return ("accounts", [key]) if changed > 0 else None
    if table == "orders":
        region, n = rng.choice(REGIONS), rng.randint(1, MAX_ORDER_N)
        if action == "delete":
            cursor.execute(
                "UPDATE orders SET e2e_version = %s WHERE region = %s AND n = %s",
                (next(versions), region, n),
            )
            changed = cursor.execute("DELETE FROM orders WHERE region = %s AND n = %s", (region, n))
        else:
            changed = cursor.execute(
                "INSERT INTO orders (region, n, amount, note, tags, e2e_version) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                "amount = VALUES(amount), tags = VALUES(tags), e2e_version = VALUES(e2e_version)",
                (
                    region,
                    n,
                    rng.randint(1, 10**6) / 100,
                    f"note {n}",
                    json.dumps([region, str(n % 7)]),
                    next(versions),
                ),
            )
        return ("orders", [region, n]) if changed > 0 else None
    if action == "insert":
        item = uuid.UUID(int=rng.getrandbits(128)).bytes
        cursor.execute(
            "INSERT INTO items (id, name, attrs, data, e2e_version) VALUES (%s, %s, %s, %s, %s)",
            (
                item,
                "item",
                json.dumps({"size": rng.randint(1, 9), "tags": ["a", "b"]}),
                rng.randbytes(8),
                next(versions),
            ),
        )
        return "items", [base64.b64encode(item).decode()]
    cursor.execute("SELECT id FROM items ORDER BY RAND() LIMIT 1")
    row = cursor.fetchone()
    if row is None:
        return None
    item = bytes(row[0])
    if action == "delete":
        cursor.execute("UPDATE items SET e2e_version = %s WHERE id = %s", (next(versions), item))
        changed = cursor.execute("DELETE FROM items WHERE id = %s", (item,))
    else:
        changed = cursor.execute(
            "UPDATE items SET name = %s, e2e_version = %s WHERE id = %s",
            (f"item {rng.random()}", next(versions), item),
        )
    return ("items", [base64.b64encode(item).decode()]) if changed > 0 else None


def mysql_main(rng: random.Random, journal: Path, stop_file: Path, pace: Pace) -> int:
    url = urlsplit(os.environ["E2E_WRITER_DSN"])
    conn = pymysql.connect(
        host=url.hostname,
        port=url.port or 3306,
        user=unquote(url.username or ""),
        password=unquote(url.password or ""),
        database=url.path.lstrip("/"),
        autocommit=False,
    )
    versions = itertools.count(1)
    with conn, conn.cursor() as cursor, journal.open("a") as out:
        while not stop_file.exists():
            pace.wait()
            conn.begin()
            changes = [
                c
                for c in (mysql_write_one(cursor, rng, versions) for _ in range(rng.randint(1, 4)))
                if c
            ]
            conn.commit()
            if changes:
                cursor.execute("SELECT @@last_gtid")
                row = cursor.fetchone()
                assert row is not None
                xid = int(str(row[0]).rsplit("-", 1)[1])
                out.write(json.dumps({"xid": xid, "changes": changes}) + "\n")
                out.flush()
    return 0


class Pace:
    """At most `per_s` transactions a second (None: no limit), on the monotonic clock."""

    def __init__(self, per_s: float | None) -> None:
        self._interval = 1 / per_s if per_s else 0.0
        self._next = time.monotonic()

    def wait(self) -> None:
        if self._interval:
            self._next = max(self._next + self._interval, time.monotonic() - 1)
            time.sleep(max(0.0, self._next - time.monotonic()))


def main(kind: str, seed: int, journal: Path, stop_file: Path, per_s: float | None) -> int:
    rng = random.Random(seed)
    pace = Pace(per_s)
    if kind == "mysql":
        return mysql_main(rng, journal, stop_file, pace)
    with (
        psycopg.connect(os.environ["E2E_WRITER_DSN"], autocommit=True) as conn,
        journal.open("a") as out,
    ):
        while not stop_file.exists():
            pace.wait()
            with conn.transaction():
                row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
                assert row is not None
                changes = [c for c in (write_one(conn, rng) for _ in range(rng.randint(1, 4))) if c]
            if changes:
                out.write(json.dumps({"xid": int(row[0]), "changes": changes}) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    per_s = float(sys.argv[5]) if len(sys.argv) > 5 else None
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), per_s))
