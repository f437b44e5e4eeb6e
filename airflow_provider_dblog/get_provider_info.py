"""Provider metadata that Airflow reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations

from typing import Any

from airflow_provider_dblog import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-dblog",
        "name": "DBLog",
        "description": "DBLog change data capture: watermark-based dumps beside a log tailer.",
        "versions": [__version__],
    }
