"""The PySpark applications of DBLog: thin entry points over `airflow_provider_dblog` (their
arguments, the SparkSession, one call into the package).

`dump.py` runs one stored dump request (`dump.spark_run.run_spark_dump`), each chunk one Spark
job whose tasks read key sub-ranges and put their rows straight into Redis, or for a direct
dump stage them into the direct target. `compact.py` folds the NDJSON change stream into the
lake's Delta tables of the latest row per key (`compaction.run.compact`).
"""
