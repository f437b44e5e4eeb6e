"""Compile the PostgreSQL log reader's hot path to C with mypyc, in place, when it is stale.

The modules (`compiled.MODULES`) are plain, mypy-strict Python; compiled, they read the log
faster. Python imports a module's compiled file before its source, so a compiled file older
than its source would run old code: this script rebuilds whenever a source is newer, and
`--remove` deletes the compiled files (the package then runs as plain Python).

    .venv/bin/python scripts/compile.py            # build if stale (setup.sh and test.sh run it)
    .venv/bin/python scripts/compile.py --remove   # back to plain Python
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

from airflow_provider_dblog.sources.postgres import compiled

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = compiled.PACKAGE.replace(".", "/")
MODULES = [f"{PACKAGE}/{name}.py" for name in compiled.MODULES]
GROUP = f"{compiled.PACKAGE}.fast_path"
"""mypyc's shared library of the modules: `fast_path__mypyc` beside them."""
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def compiled_files() -> list[Path]:
    names = [Path(m).with_suffix(SUFFIX) for m in MODULES]
    return [ROOT / n for n in names] + [ROOT / PACKAGE / f"fast_path__mypyc{SUFFIX}"]


def stale() -> bool:
    built = compiled_files()
    if not all(f.exists() for f in built):
        return True
    oldest = min(f.stat().st_mtime for f in built)
    return any((ROOT / m).stat().st_mtime > oldest for m in MODULES)


def remove() -> None:
    for f in compiled_files():
        f.unlink(missing_ok=True)


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    os.chdir(ROOT)  # mypy reads its settings from pyproject.toml here
    remove()
    with tempfile.TemporaryDirectory() as tmp:
        extensions = mypycify(MODULES, opt_level="3", group_name=GROUP, target_dir=tmp)
        dist = Distribution({"name": "dblog-fast-path", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.inplace = True  # type: ignore[attr-defined]
        command.build_temp = tmp  # type: ignore[attr-defined]
        dist.run_command("build_ext")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", action="store_true", help="delete the compiled files")
    args = parser.parse_args()
    if args.remove:
        remove()
        return 0
    if not stale():
        return 0
    try:
        import mypyc  # noqa: F401
    except ImportError:
        print(
            "compile: mypyc is not installed; the log reader runs as plain Python", file=sys.stderr
        )
        return 0
    build()
    print("compile: the log reader's hot path is compiled", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
