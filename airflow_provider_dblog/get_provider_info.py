"""Provider metadata that Airflow reads through the `apache_airflow_provider` entry point.

Only names: nothing is imported here, so listing providers stays cheap.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_dblog import __version__

_P = "airflow_provider_dblog"

_CONN_FIELDS = {
    "source": {
        "label": "Source ([source])",
        "description": "Required unless a config path is given: the TOML's [source] section as "
        'JSON, e.g. {"type": "postgres", "name": "shop", "dsn": "host=db.internal '
        'dbname=shop user=dblog", "tables": ["public.orders"]}; no password (below)',
        "schema": {"type": ["object", "null"]},
    },
    "output": {
        "label": "Output ([output])",
        "description": "Required unless a config path is given: the TOML's [output] section "
        'as JSON, e.g. {"type": "ndjson", "directory": "/var/lib/dblog/events"}',
        "schema": {"type": ["object", "null"]},
    },
    "lake": {
        "label": "Lake ([lake])",
        "description": 'Optional: the TOML\'s [lake] section, e.g. {"root": "/var/lib/dblog/lake"}',
        "schema": {"type": ["object", "null"]},
    },
    "config_path": {
        "label": "DBLog config path",
        "description": "Instead of the sections above: the deployment's TOML, on every worker "
        "and the Spark driver",
        "schema": {"type": ["string", "null"]},
    },
    "source_name": {
        "label": "Source name",
        "description": "With a config path: [source] name in that TOML (it names the source in "
        "events)",
        "schema": {"type": ["string", "null"]},
    },
    "ui_url": {
        "label": "Live view URL",
        "description": "Optional: where `dblog ui` is reached, such as "
        "http://dblog-ui.internal:8765/; each dump task then links to its dump there",
        "schema": {"type": ["string", "null"]},
    },
    "source_conn_id": {
        "label": "Source connection id",
        "description": "Optional: a postgres or mysql connection whose password is the source's",
        "schema": {"type": ["string", "null"]},
    },
    "source_password": {
        "label": "Source password",
        "description": "Optional, instead of a source connection id",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
    "ssl": {
        "label": "Redis over TLS",
        "schema": {"type": ["boolean", "null"], "default": False},
    },
    "ca_file": {
        "label": "Redis CA file",
        "description": "Optional: the CA certificate (PEM) Redis' certificate is checked against",
        "schema": {"type": ["string", "null"]},
    },
    "cert_file": {
        "label": "Redis client certificate file",
        "description": "Optional: this client's certificate (PEM), with its key file",
        "schema": {"type": ["string", "null"]},
    },
    "key_file": {
        "label": "Redis client key file",
        "schema": {"type": ["string", "null"]},
    },
    "sentinels": {
        "label": "Redis sentinels",
        "description": "Optional: host:port of each sentinel, comma-separated (host and port "
        "above are then unused)",
        "schema": {"type": ["string", "null"]},
    },
    "service_name": {
        "label": "Sentinel service name",
        "description": "With sentinels: the name they know the primary by",
        "schema": {"type": ["string", "null"]},
    },
    "sentinel_password": {
        "label": "Sentinel password",
        "description": "Optional: the sentinels' own password (requirepass)",
        "schema": {"type": ["string", "null"], "format": "password"},
    },
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-dblog",
        "name": "DBLog",
        "description": (
            "DBLog change data capture: watermark-based dumps on Spark beside a log tailer, "
            "for PostgreSQL and MySQL/MariaDB."
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
        "operators": [
            {
                "integration-name": "DBLog",
                "python-modules": [f"{_P}.operators.dblog", f"{_P}.operators.verify"],
            }
        ],
        "sensors": [
            {
                "integration-name": "DBLog",
                "python-modules": [f"{_P}.sensors.dblog", f"{_P}.sensors.verify"],
            }
        ],
        "triggers": [
            {
                "integration-name": "DBLog",
                "python-modules": [
                    f"{_P}.triggers.dblog",
                    f"{_P}.triggers.changes",
                    f"{_P}.triggers.verify",
                ],
            }
        ],
        "extra-links": [f"{_P}.operators.links.DBLogLiveViewLink"],
        "asset-uris": [{"schemes": ["dblog"], "handler": f"{_P}.assets.sanitize_uri"}],
        "queues": [f"{_P}.queues.dblog.DBLogMessageQueueProvider"],
        "connection-types": [
            {
                "hook-class-name": f"{_P}.hooks.dblog.DBLogHook",
                "hook-name": "DBLog",
                "connection-type": "dblog",
                "ui-field-behaviour": {
                    "hidden-fields": ["extra"],
                    "relabeling": {
                        "host": "Redis host",
                        "port": "Redis port",
                        "schema": "Redis database number",
                        "login": "Redis user (ACL)",
                        "password": "Redis password",
                    },
                    "placeholders": {
                        "host": "redis.internal",
                        "port": "6379",
                        "schema": "0",
                        "source_name": "shop",
                        "config_path": "/etc/dblog/dblog.toml",
                        "source_conn_id": "postgres_shop",
                        "sentinels": "sentinel-1:26379, sentinel-2:26379, sentinel-3:26379",
                        "service_name": "mymaster",
                    },
                },
                "conn-fields": _CONN_FIELDS,
            }
        ],
    }
