"""What every `dblog` command shares: the config file option and the objects built from it."""

from __future__ import annotations

import argparse
import logging
import os

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.state import StateStore

DEFAULT_CONFIG = "dblog.toml"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        "-c",
        default=os.environ.get("DBLOG_CONFIG", DEFAULT_CONFIG),
        help="the TOML configuration file (default: $DBLOG_CONFIG or %(default)s)",
    )


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def config_of(args: argparse.Namespace) -> Config:
    return load_config(args.config)


def store_of(config: Config) -> StateStore:
    return StateStore(config.redis_client(), config.source.name)
