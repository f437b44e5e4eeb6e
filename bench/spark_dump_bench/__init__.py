"""The Spark dump benchmark's parts, one idea a module; `bench/bench_spark_dump.py` runs them.

fixture     the sizes, the tables, the tailer's output and the Spark session every part uses
cpu_meter   where a dump's CPU goes: Spark's JVM tree, the driver, the PostgreSQL and Redis trees
results     the figures each part returns, and the report that collects them
throughput  P2: COPY's ceiling, a dump through Spark, and `dblog dump` in this process
direct      P2 direct: the target the direct dumps write into, and the dumps
chunk_cost  the overhead per chunk and the breakdown of a chunk's time, from timed dumps
read_paths  Spark's JDBC source against our read in mapPartitions
report      the lines printed as the figures come and the table at the end
"""
