"""The `[tailer]` options, `TailerSettings`; they live in `airflow_provider_dblog.settings`, below
everything that reads them, and are importable here too."""

from airflow_provider_dblog.settings import TailerSettings

__all__ = ["TailerSettings"]
