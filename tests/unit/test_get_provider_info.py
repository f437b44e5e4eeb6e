"""The provider as Airflow finds it: its metadata names importable classes, Airflow's CLI
lists it, and the providers manager renders the `dblog` connection form from it and lists
its extra link."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from airflow_provider_dblog.get_provider_info import get_provider_info

BIN = Path(sys.executable).parent


def test_provider_info_names_importable_classes() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-dblog"
    for kind in ("hooks", "operators", "sensors", "triggers"):
        (entry,) = info[kind]
        for module in entry["python-modules"]:
            importlib.import_module(module)
    (queue,) = info["queues"]
    module, _, name = queue.rpartition(".")
    assert getattr(importlib.import_module(module), name)().scheme_matches("dblog")
    (connection,) = info["connection-types"]
    module, _, name = connection["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert hook.conn_type == connection["connection-type"] == "dblog"


def test_airflow_lists_the_provider_and_renders_its_connection_form(tmp_path: Path) -> None:
    env = dict(os.environ, AIRFLOW_HOME=str(tmp_path))
    listed = subprocess.run(
        [str(BIN / "airflow"), "providers", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "airflow-provider-dblog" in listed.stdout

    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook = ProvidersManagerTaskRuntime().hooks["dblog"]
    assert hook is not None and hook.hook_class_name.endswith("DBLogHook")
    manager = ProvidersManager()
    widgets = {k: v.field for k, v in manager.connection_form_widgets.items() if "dblog" in k}
    assert set(widgets) == {
        f"extra__dblog__{name}"
        for name in (
            *("source", "output", "lake", "source_name", "config_path"),
            *("source_conn_id", "source_password", "ssl"),
            *("ca_file", "cert_file", "key_file"),
            *("sentinels", "service_name", "sentinel_password", "ui_url"),
        )
    }
    # The configuration's sections: JSON objects, which the form edits as JSON.
    for section in ("source", "output", "lake"):
        assert widgets[f"extra__dblog__{section}"]["schema"]["type"] == ["object", "null"]
    assert manager.connection_form_widgets["extra__dblog__source_password"].is_sensitive
    assert manager.connection_form_widgets["extra__dblog__sentinel_password"].is_sensitive
    behaviour = manager.field_behaviours["dblog"]
    assert behaviour["relabeling"]["host"] == "Redis host"
    assert behaviour["hidden_fields"] == ["extra"]
    # `airflow providers links` lists the dump task's link.
    link = "airflow_provider_dblog.operators.links.DBLogLiveViewLink"
    assert link in manager.extra_links_class_names
