"""The lake output: one Delta Lake table per captured table, in real types, that keeps per key
the row with the highest log position (`table.LakeTable`). The compaction folds the change
stream into it (`airflow_provider_dblog.compaction`) and direct dumps write their chunks into it
(`direct.py`). `schema.py` is a table's lake schema, in the types each source's dialect maps
its own into (`sources/lake_types.py`); `catalog.py` reads a table's schema from its source."""

CURSOR_FILE = "_compact_state.json"
"""At the lake's root: the compaction's read cursor, where its last run stopped reading the
tailer's event files (`compaction/segments.CompactState`); verify reads it too
(`target_rows.py`)."""
