"""Provider metadata that Airflow reads through the `apache_airflow_provider` entry point.

Only names: nothing is imported here, so listing providers stays cheap.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_dblog import __version__

_P = "airflow_provider_dblog"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-dblog",
        "name": "DBLog",
        "description": (
            "DBLog change data capture: watermark-based dumps on Spark beside a log tailer, "
            "for PostgreSQL (MySQL/MariaDB planned)."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "DBLog",
                "external-doc-url": "https://arxiv.org/abs/2010.12597",
                "tags": ["software"],
            }
        ],
        "hooks": [{"integration-name": "DBLog", "python-modules": [f"{_P}.hooks.dblog"]}],
        "operators": [{"integration-name": "DBLog", "python-modules": [f"{_P}.operators.dblog"]}],
        "sensors": [{"integration-name": "DBLog", "python-modules": [f"{_P}.sensors.dblog"]}],
        "triggers": [{"integration-name": "DBLog", "python-modules": [f"{_P}.triggers.dblog"]}],
        "connection-types": [
            {"hook-class-name": f"{_P}.hooks.dblog.DBLogHook", "connection-type": "dblog"}
        ],
    }
