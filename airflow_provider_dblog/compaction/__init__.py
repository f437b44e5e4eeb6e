"""The compaction: the tailer's NDJSON output folded into the lake tables
(`airflow_provider_dblog.lake`), incrementally, each table keeping per key the row with the
highest position. `spark_jobs/compact.py` is its application.

`rules.py` says which event of a key wins within a run and how a line becomes changes;
`segments.py` cuts the event files into the pieces executors read, and keeps the read cursor;
`changes.py` parses and folds a run's segments, on Spark's executors or in the driver;
`evolution.py` creates new tables and folds schema events into them; `table_fold.py` writes one
table's part of a run; `run.py` is a run, under the output directory's lock;
`maintenance.py` is the tables' upkeep under the same lock (compact small files, vacuum files
no version within the retention names, checkpoint the log: `dblog lake maintain`).
"""
