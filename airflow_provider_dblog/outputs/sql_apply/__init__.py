"""SQL apply: the change stream applied to tables in a PostgreSQL target, upserting c/u/r and
deleting d by key, truncating at `t` and altering the table at `s`; and direct dumps written
into the same tables.

- `target.py`: a target table as the catalog describes it, and values adapted to its columns;
- `statements.py`: the statements of a row event and of a truncate, and monotonic mode (the
  per-key positions of `dblog_positions`, its tombstones and floors);
- `schema_change.py`: what an `s` event alters in the target table;
- `batch.py`: the connection, one transaction per batch, its fence, and the retry of a
  transaction a deadlock rolled back (`SqlApplyOutput`);
- `direct.py`: direct dumps' rows, written by the dump's driver (`SqlDirectTarget`).
"""

from airflow_provider_dblog.outputs.sql_apply.batch import SqlApplyOutput
from airflow_provider_dblog.outputs.sql_apply.direct import SqlDirectTarget

__all__ = ["SqlApplyOutput", "SqlDirectTarget"]
