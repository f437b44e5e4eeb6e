"""A write workload in its own process, for the end-to-end tests.

    python -m tests.integration.e2e_writer SEED JOURNAL STOP_FILE

Connects with the DSN in `$E2E_WRITER_DSN` and runs random inserts, updates and deletes on the
three sample tables of demo.py (accounts: bigint key, orders: (text, int) key, items: uuid key),
1-4 statements per transaction, until STOP_FILE exists. After each commit it appends one JSON
line to JOURNAL: `{"xid": N, "changes": [[table, key-as-list], ...]}` with only the statements
that changed a row, so a test can check that every committed change reached the output.

Every row it writes is stamped with a version from one sequence (`e2e_version`, which
e2e_support adds to the tables): one writer commits in sequence order, so in a correct output a
key's version never goes down, and a stale row shows as one that does. A row about to be
deleted is stamped first, so a stale copy of it emitted after its delete shows too.
"""

from __future__ import annotations

import json
import os
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
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


def main(seed: int, journal: Path, stop_file: Path) -> int:
    rng = random.Random(seed)
    with (
        psycopg.connect(os.environ["E2E_WRITER_DSN"], autocommit=True) as conn,
        journal.open("a") as out,
    ):
        while not stop_file.exists():
            with conn.transaction():
                row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
                assert row is not None
                changes = [c for c in (write_one(conn, rng) for _ in range(rng.randint(1, 4))) if c]
            if changes:
                out.write(json.dumps({"xid": int(row[0]), "changes": changes}) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
