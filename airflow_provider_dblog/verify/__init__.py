"""Verify a target against its source while writes go on (the rule: `core/verify.py`).

- `reader.py`: what a target must answer to be verified (`TargetReader`);
- `targets.py`: which reader a deployment's configuration names (the SQL-apply target's is
  `sources/postgres/target_rows.py`, opened through the source factory);
- `request.py`: a validated verify request, refused before anything is stored;
- `chunk.py`: one chunk, read on both sides between three points of the log;
- `runner.py`: a run over its tables, chunks in flight up to its parallelism, obeying its
  controls (a dump's), saved in the store as it goes;
- `metrics.py`: the recent runs' counts, served with the tailer's Prometheus metrics.
"""
