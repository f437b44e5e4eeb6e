"""The PySpark applications of DBLog: thin entry points over `airflow_provider_dblog`.

`dump.py` runs one stored dump request, each chunk one Spark job whose tasks read key
sub-ranges and put their rows straight into Redis. `compact.py` folds the NDJSON change stream
into the lake's Delta tables of the latest row per key (`airflow_provider_dblog.lake`).
"""
