"""The package zip that the Spark dump ships to executors: complete but for the throwaway
servers and the demo, importable on its own, without bytecode, and built once per version of
the code; and the executors' Python: the driver's unless one is named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from airflow_provider_dblog.cli.common import CLONE_ONLY
from airflow_provider_dblog.spark_package import PACKAGE, package_zip, use_driver_python


def test_zip_holds_every_module_and_data_file_and_no_bytecode(tmp_path: Path) -> None:
    zipped = package_zip(tmp_path)
    names = set(zipfile.ZipFile(zipped).namelist())
    on_disk = {
        f"airflow_provider_dblog/{p.relative_to(PACKAGE).as_posix()}"
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }
    left_out = {
        n for n in on_disk if n.replace("/", ".").startswith(tuple(f"{c}." for c in CLONE_ONLY))
    }
    assert "airflow_provider_dblog/devservices/postgres.py" in left_out
    assert "airflow_provider_dblog/demo/story.py" in left_out
    assert names == on_disk - left_out
    assert "airflow_provider_dblog/sources/postgres/chunks.py" in names
    assert "airflow_provider_dblog/ui/static/index.html" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_zip_is_importable_without_the_installed_package(tmp_path: Path) -> None:
    zipped = package_zip(tmp_path)
    # -S: no site-packages, so neither the editable install nor any dependency is found.
    found = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            "import airflow_provider_dblog.core.event as m; print(m.__file__)",
        ],
        env={"PYTHONPATH": str(zipped)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == f"{zipped}/airflow_provider_dblog/core/event.py"


def test_same_code_is_a_cache_hit_changed_code_a_new_zip(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "airflow_provider_dblog"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    first = package_zip(tmp_path / "zips", package=copy)
    built = first.stat()
    assert package_zip(tmp_path / "zips", package=copy) == first
    assert first.stat().st_ino == built.st_ino and first.stat().st_mtime_ns == built.st_mtime_ns

    (copy / "core" / "__pycache__").mkdir(exist_ok=True)
    (copy / "core" / "__pycache__" / "event.cpython-311.pyc").write_bytes(b"bytecode")
    assert package_zip(tmp_path / "zips", package=copy) == first  # bytecode does not count

    (copy / "core" / "event.py").write_text("CHANGED = True\n")
    second = package_zip(tmp_path / "zips", package=copy)
    assert second != first
    assert (
        zipfile.ZipFile(second).read("airflow_provider_dblog/core/event.py") == b"CHANGED = True\n"
    )
    assert sorted(p.name for p in (tmp_path / "zips").iterdir()) == sorted(
        [first.name, second.name]
    )


def test_the_same_code_gives_the_same_bytes(tmp_path: Path) -> None:
    one, two = package_zip(tmp_path / "a"), package_zip(tmp_path / "b")
    assert one.name == two.name and one.read_bytes() == two.read_bytes()


def test_a_package_imported_from_an_archive_is_refused(tmp_path: Path) -> None:
    zipped = package_zip(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        package_zip(tmp_path, package=zipped / "airflow_provider_dblog")


@pytest.mark.parametrize("named", [None, ""])
def test_the_workers_run_the_drivers_python(
    named: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if named is None:
        monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    else:
        monkeypatch.setenv("PYSPARK_PYTHON", named)
    use_driver_python()
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_the_workers_python_named_by_the_deployment_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # spark-submit puts `spark.pyspark.python` there for its driver.
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/workers/bin/python")
    use_driver_python()
    assert os.environ["PYSPARK_PYTHON"] == "/opt/workers/bin/python"
