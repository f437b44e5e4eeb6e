"""The dump: rows read from the source's tables between watermarks, beside the running log.

A person asks for a dump (tables, or one table's keys): `request.py` checks that against the
captured tables and the source's key columns and gives a `core.dump_plan.DumpRequest`. The
pure planner (`core.dump_plan.TablePlanner`) turns it into keyset chunks. `chunk.py` reads one
chunk between a low and a high watermark (the paper's Algorithm 1, dump side). `runner.py`
walks a stored request chunk after chunk, under its controls, saving progress after each; the
CLI reads chunks in its own process, the Spark application (`spark_run.py`) by Spark tasks
(`spark_chunk.py`, and `spark_direct.py` for a direct dump).
"""
