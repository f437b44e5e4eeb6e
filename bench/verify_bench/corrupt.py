"""0.1% of the target's rows corrupted behind the tailer's back, a third each changed, deleted
and added, at keys known exactly; and what a run's differing keys are against them.

The corrupted keys are odd and the write load (`writes.py`) updates even keys only, so the
corruptions stay as made while it writes: every other key a run reports is a false difference.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.lake.table import table_uri
from verify_bench.deployment import TABLE

Found = set[tuple[Difference, int]]


@dataclass(frozen=True)
class Corruption:
    changed: list[int]
    missing: list[int]
    extra: list[int]

    @staticmethod
    def pick(rows: int, seed: int) -> Corruption:
        """0.1% of `rows` (3 at least) odd keys: changed and missing ones among the table's,
        extra ones above it (distinct for each seed)."""
        third = max(1, rows // 1000 // 3)
        odd = random.Random(seed).sample(range(1, rows + 1, 2), 2 * third)
        extra = [rows + 1 + 2 * (seed * third + i) for i in range(third)]
        return Corruption(sorted(odd[:third]), sorted(odd[third:]), extra)

    @property
    def keys(self) -> Found:
        return {
            *((Difference.CHANGED, k) for k in self.changed),
            *((Difference.MISSING, k) for k in self.missing),
            *((Difference.EXTRA, k) for k in self.extra),
        }

    def __len__(self) -> int:
        return len(self.changed) + len(self.missing) + len(self.extra)

    def judge(self, found: Found) -> tuple[int, int]:
        """Of `found`: the corrupted keys named with how they differ, and the other keys (a
        key named with another kind counts as other)."""
        right = len(found & self.keys)
        return right, len(found) - right

    def apply_sql(self, target_dsn: str) -> None:
        with psycopg.connect(target_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE public.vrows SET name = name || '-corrupt' WHERE id = ANY(%s)",
                (self.changed,),
            )
            conn.execute("DELETE FROM public.vrows WHERE id = ANY(%s)", (self.missing,))
            conn.execute(
                "INSERT INTO public.vrows SELECT i, 'extra-' || i, 0, 0, now()"
                " FROM unnest(%s::bigint[]) AS i",
                (self.extra,),
            )

    def apply_lake(self, root: Path) -> None:
        """Through deltalake, as any writer of the table (retried on a commit the
        compaction's raced): the changed rows rewritten, the missing deleted, the extra
        appended as copies of the changed rows under new keys."""
        uri = table_uri(root, TABLE)
        for attempt in range(20):
            try:
                table = DeltaTable(uri)
                rows = table.to_pyarrow_table(filters=[("id", "in", self.changed)])
                rows = rows.slice(0, len(self.extra)).set_column(
                    rows.schema.get_field_index("id"), "id", pa.array(self.extra, pa.int64())
                )
                listed = ", ".join(str(k) for k in self.changed)
                table.update(predicate=f"id IN ({listed})", updates={"name": "'corrupt'"})
                listed = ", ".join(str(k) for k in self.missing)
                DeltaTable(uri).delete(f"id IN ({listed})")
                write_deltalake(uri, rows, mode="append")
                return
            except CommitFailedError:
                if attempt == 19:
                    raise


def trigger_written(target_dsn: str) -> None:
    """Note every key of the target's table that anything writes from now on (`written`)."""
    with psycopg.connect(target_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_written (id bigint, op text)")
        conn.execute("TRUNCATE bench_written")
        conn.execute(
            "CREATE OR REPLACE FUNCTION bench_note_written() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN INSERT INTO bench_written VALUES (COALESCE(NEW.id, OLD.id), TG_OP);"
            " RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE TRIGGER bench_written AFTER INSERT OR UPDATE OR DELETE ON public.vrows"
            " FOR EACH ROW EXECUTE FUNCTION bench_note_written()"
        )


def written(target_dsn: str) -> set[int]:
    """The keys written since `trigger_written`, which is removed."""
    with psycopg.connect(target_dsn, autocommit=True) as conn:
        keys = {int(k) for (k,) in conn.execute("SELECT id FROM bench_written").fetchall()}
        conn.execute("DROP TRIGGER bench_written ON public.vrows")
    return keys
