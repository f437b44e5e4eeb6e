"""The verify benchmark's parts, one idea a module; `bench/bench_verify.py` runs them.

deployment  a source table, a tailer (`dblog tail`) keeping a target, dumps and verify runs
corrupt     the target's rows corrupted at keys known exactly, and what a run found against them
writes      a write load on the verified table that never touches a corrupted key
reladiff    reladiff in its own venv, on the same source and target
checksum    pt-table-checksum and pt-table-sync on a MariaDB primary and its replica
"""
