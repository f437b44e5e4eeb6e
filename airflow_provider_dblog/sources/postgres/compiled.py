"""The log reader's hot path, compiled to C by mypyc (`scripts/compile.py`), or plain Python.

Python imports a module's compiled file before its source. Setting `DBLOG_PLAIN_PYTHON=1` makes
these modules import from their source even where compiled files exist: to step through them in
a debugger, to sample them with a Python profiler, and for the tests that run both forms.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PACKAGE = __name__.rpartition(".")[0]
MODULES = ("changes", "replication", "tuples")
"""The modules compiled, in this package; mypyc builds them as one group."""
PLAIN_PYTHON_ENV = "DBLOG_PLAIN_PYTHON"


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' sources, ahead of the default finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in MODULES:
            return None
        return importlib.util.spec_from_file_location(
            fullname, Path(__file__).with_name(f"{name}.py")
        )


def use_plain_python_if_asked() -> None:
    """Import the modules from source when `DBLOG_PLAIN_PYTHON` is set (before any is imported)."""
    if os.environ.get(PLAIN_PYTHON_ENV) and not any(
        isinstance(f, _SourceFirst) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _SourceFirst())


def running_compiled() -> bool:
    """Whether the log reader runs compiled (its module was loaded from a compiled file)."""
    from airflow_provider_dblog.sources.postgres import replication

    return not (replication.__file__ or "").endswith(".py")
