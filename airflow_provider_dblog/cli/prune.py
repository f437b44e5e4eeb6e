"""`dblog prune`: forget the target's tombstones that no older row can reach any more.

A target keyed by position (SQL apply in monotonic mode) keeps each delete's position, so that an
older image of the key (a direct dump's row, a replayed create) does not come back. A direct
dump prunes a table's tombstones when it finishes the table; deletes keep coming from the log
in between, so run this on a schedule of your own (cron, an Airflow task) to keep
`dblog_positions` bounded. It prunes every captured table before the tombstone horizon: the
oldest lw of the direct windows still pending, bounded by the tailer's checkpoint
(`DirectWindowStore.horizon`). Without a checkpoint yet, it prunes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from airflow_provider_dblog.cli.common import add_config_option, config_of, store_of
from airflow_provider_dblog.targets import direct_target_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    prune = subparsers.add_parser(
        "prune", help="forget the target's tombstones older than the tombstone horizon"
    )
    add_config_option(prune)
    prune.set_defaults(func=_prune)


def _prune(args: argparse.Namespace) -> int:
    config = config_of(args)
    target = direct_target_for(config)  # refused, saying why, where the output keeps none
    try:
        horizon = store_of(config).directs.horizon()
        if horizon is None:
            print("no tombstone horizon yet (the tailer saved no checkpoint): nothing pruned")
            return 0
        for table in config.source.tables:
            pruned = target.prune_tombstones(table, horizon)
            print(f"{table}: {pruned} tombstones before {horizon.to_json()} pruned")
        return 0
    finally:
        target.close()
