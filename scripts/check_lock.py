"""Refuse a lock that disagrees with pyproject.toml.

Every requirement of the package, its extras included, must be pinned in the lock to a version
its range admits; otherwise setup would install untested versions, or none at all.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints-3.11.txt"


def pins(lock: Path) -> dict[str, Version]:
    """The lock's `name==version` lines, by canonical name."""
    found = {}
    for line in lock.read_text().splitlines():
        spec = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            found[canonicalize_name(name.split("[", 1)[0])] = Version(version.strip())
    return found


def requirements(project: dict) -> list[Requirement]:
    """Every requirement of the package and of all its extras, the self-references left out."""
    name = canonicalize_name(project["name"])
    listed = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        listed.extend(extra)
    wanted = [Requirement(text) for text in listed]
    return [r for r in wanted if canonicalize_name(r.name) != name]


def problems(project: dict, pinned: dict[str, Version]) -> list[str]:
    found = []
    for req in requirements(project):
        key = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({"python_version": "3.11"}):
            continue
        if key not in pinned:
            found.append(f"{req.name} is required by pyproject.toml but not pinned")
        elif not req.specifier.contains(pinned[key], prereleases=True):
            found.append(f"{req.name}=={pinned[key]} is pinned but pyproject.toml asks {req}")
    return found


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if not LOCK.exists():
        print(f"lock: {LOCK.name} is missing; run 'bash scripts/lock.sh'", file=sys.stderr)
        return 1
    found = problems(project, pins(LOCK))
    for problem in found:
        print(f"lock: {problem}; run 'bash scripts/lock.sh keep'", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
