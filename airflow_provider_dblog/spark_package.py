"""What the Spark applications' Python workers need: this package as a zip (`--py-files`,
`SparkContext.addPyFile`), so the workers of a cluster need only the third-party dependencies
installed (msgspec, psycopg, PyMySQL, redis); and a Python that has them (`use_driver_python`).
The zip leaves out what the wheel leaves out (the throwaway servers and the demo,
`LEFT_OUT`): no executor runs them.

The zip is named by a hash of its contents: it is built once per version of the code and gets
a new name when the code changes (one Spark application refuses two files of one name).
Its timestamps are fixed, so the same code always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)
PACKAGE = Path(__file__).resolve().parent
_EPOCH = (1980, 1, 1, 0, 0, 0)
LEFT_OUT = ("devservices", "demo")
"""The subpackages pyproject's `packages.find` excludes from the wheel (`cli.common.CLONE_ONLY`)."""


def package_zip(directory: Path | str | None = None, *, package: Path = PACKAGE) -> Path:
    """The path of the package's zip in `directory` (default: a private directory of this user
    under the temp dir), built if no zip of the same contents is there yet. For the
    SparkSubmitHook's `py_files`, or `SparkContext.addPyFile`."""
    if not package.is_dir():
        raise FileNotFoundError(f"{package} is not a directory (imported from an archive?)")
    files = [
        (f"{package.name}/{path.relative_to(package).as_posix()}", path.read_bytes())
        for path in sorted(package.rglob("*"))
        if path.is_file()
        and path.relative_to(package).parts[0] not in LEFT_OUT
        and "__pycache__" not in path.parts
        and path.suffix not in (".pyc", ".pyo")
        and not path.name.startswith(".")
    ]
    digest = hashlib.sha256()
    for name, data in files:
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    where = Path(directory) if directory is not None else _private_temp_dir()
    where.mkdir(parents=True, exist_ok=True)
    target = where / f"{package.name}-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(dir=where, prefix=".", suffix=".zip")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w") as archive:
            for name, data in files:
                info = zipfile.ZipInfo(name, _EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)
        os.replace(tmp, target)  # a concurrent builder writes the same bytes: either one wins
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def ship_package(sc: SparkContext) -> None:
    """Send the package to the executors of this application, unless spark-submit's
    `--py-files` already did (Spark refuses a second file of the same name). A driver that
    imports the package from a zip (cluster deploy mode) got it from `--py-files` too."""
    if not PACKAGE.is_dir():
        return
    zipped = package_zip()
    if zipped.name not in sc.getConf().get("spark.submit.pyFiles", ""):
        sc.addPyFile(str(zipped))
        log.info("shipping %s to the executors", zipped.name)


def use_driver_python() -> None:
    """Have this application's Python workers run the interpreter that runs its driver, unless
    PYSPARK_PYTHON names one (spark-submit sets it from `spark.pyspark.python`). Without it
    PySpark starts them with the `python3` on the executor's PATH, whatever the master, which
    need not have the dependencies: a driver run by a virtualenv's `python` and a system
    `python3` fail at the first job with "No module named 'msgspec'". On a cluster the
    workers run the driver's path: their nodes need that interpreter (the same image or
    virtualenv), or name theirs. Call it before the SparkContext starts, which reads the
    variable once."""
    if not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable


def _private_temp_dir() -> Path:
    """A cache directory only this user can write: executors run the code found in it."""
    where = Path(tempfile.gettempdir()) / f"dblog-spark-package-{os.getuid()}"
    where.mkdir(mode=0o700, exist_ok=True)
    info = where.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{where} is not a private directory of this user: pass another")
    return where
