"""The few reads and writes of a Delta log that delta-rs's Python API does not offer: the add
actions of a version as the log spells them (with their deletion vectors, which
`DeltaTable.get_add_actions` leaves out), and a commit of actions written here.

A commit is the JSON file of the next version, created only if absent (written aside, then
hard-linked into place: a reader never sees half a commit, and of two writers of one version
exactly one wins, as delta-rs commits on a local file system). A lake root is a local path.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from airflow_provider_dblog.lake.deletion_vectors import z85_decoded

Action = dict[str, Any]
CHECKPOINT_INTERVAL = 100
"""Delta's default `delta.checkpointInterval`: a commit written here at a multiple of it
writes a checkpoint too (`LakeTable`), as delta-rs does after its own."""


class LostCommit(Exception):
    """Another writer committed the version first: read the new one and write again."""


def log_dir(table_dir: str | Path) -> Path:
    return Path(table_dir) / "_delta_log"


def active_adds(table_dir: str | Path, version: int) -> dict[str, Action]:
    """The add actions of the files that make up `version`, by path: the last checkpoint at
    or before it, then the commits after; or, where this process replayed the log of the
    table up to a version not long before, the commits after that one (a follower's run
    after run, whose log gathers up to a checkpoint interval of commits of one action per
    file each)."""
    log = log_dir(table_dir)
    start, adds = _replayed(log, version) or _checkpoint(log, version)
    for at in range(start, version + 1):
        with open(log / f"{at:020d}.json", encoding="utf-8") as commit:
            for line in commit:
                if not line.strip():
                    continue
                action = json.loads(line)
                if "add" in action:
                    adds[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    adds.pop(action["remove"]["path"], None)
    if version > 0:  # not a table just made (a write's staging table): nothing to save
        with _REPLAYED_LOCK:
            _REPLAYED[log] = (version, _identity(log, version), dict(adds))
            _REPLAYED.move_to_end(log)
            while len(_REPLAYED) > REPLAYED_TABLES:
                _REPLAYED.popitem(last=False)
    return adds


REPLAYED_TABLES = 32
"""The tables whose last replayed adds this process keeps (`active_adds`)."""
_REPLAYED: OrderedDict[Path, tuple[int, tuple[int, int, int] | None, dict[str, Action]]] = (
    OrderedDict()
)
_REPLAYED_LOCK = threading.Lock()


def _replayed(log: Path, version: int) -> tuple[int, dict[str, Action]] | None:
    """The first commit after the version this process last replayed of `log`, and its adds,
    if that version is at most a checkpoint interval before `version` and its commit file is
    the one replayed (a table removed and created again at the same path has another)."""
    with _REPLAYED_LOCK:
        found = _REPLAYED.get(log)
    if found is None:
        return None
    replayed, identity, adds = found
    if not version - CHECKPOINT_INTERVAL <= replayed <= version:
        return None
    if identity is None or _identity(log, replayed) != identity:
        return None
    return replayed + 1, dict(adds)


def _identity(log: Path, version: int) -> tuple[int, int, int] | None:
    """What tells the commit file of `version` from another written at its path later."""
    try:
        found = (log / f"{version:020d}.json").stat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def _checkpoint(log: Path, version: int) -> tuple[int, dict[str, Action]]:
    """The first commit after the newest checkpoint at or before `version`, and its adds."""
    found = sorted(
        (int(path.name.split(".")[0]), path)
        for path in log.glob("*.checkpoint*.parquet")
        if int(path.name.split(".")[0]) <= version
    )
    if not found:
        return 0, {}
    newest = found[-1][0]
    adds: dict[str, Action] = {}
    for at, path in found:
        if at != newest:
            continue
        column = pq.ParquetFile(path).read(columns=["add"])["add"]  # no dataset discovery
        for add in column.to_pylist():
            if add is not None:
                for name in ("partitionValues", "tags"):  # maps, read as lists of pairs
                    if add.get(name) is not None:
                        add[name] = dict(add[name])
                adds[add["path"]] = {k: v for k, v in add.items() if v is not None}
    return newest + 1, adds


def vectors_in_use(table_dir: str | Path, version: int, since_ms: int) -> set[str] | None:
    """The names of the deletion vector files that `version`, or any version time travel to
    `since_ms` or later reaches, refers to; None if the log no longer says (its commits from
    then were cleaned up with no checkpoint before them)."""
    log = log_dir(table_dir)
    first = version
    while first > 0 and (log / f"{first:020d}.json").exists():
        if (log / f"{first:020d}.json").stat().st_mtime * 1000 <= since_ms:
            break  # the version in effect at since_ms
        first -= 1
    try:
        adds = list(active_adds(table_dir, first).values())
        for at in range(first + 1, version + 1):
            with open(log / f"{at:020d}.json", encoding="utf-8") as commit:
                actions = [json.loads(line) for line in commit if line.strip()]
            adds += [action["add"] for action in actions if "add" in action]
    except FileNotFoundError:
        return None
    return {_vector_file(a["deletionVector"]) for a in adds if a.get("deletionVector")}


def _vector_file(descriptor: Mapping[str, Any]) -> str:
    """The file name of a deletion vector stored in a file (`u`: a uuid in Z85 after a
    prefix; `p`: a path), "" for one stored inline."""
    stored, where = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if stored == "u":
        return f"deletion_vector_{_uuid(where[-20:])}.bin"
    return Path(where).name if stored == "p" else ""


def _uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=z85_decoded(text))


def commit(table_dir: str | Path, version: int, actions: Iterable[Action]) -> None:
    """Write `actions` as `version`'s commit; `LostCommit` if another writer's came first."""
    log = log_dir(table_dir)
    aside = log / f".dblog-{uuid.uuid4()}.json.tmp"
    aside.write_text("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))
    try:
        os.link(aside, log / f"{version:020d}.json")
    except FileExistsError:
        message = f"version {version} of {table_dir} was committed by another writer"
        raise LostCommit(message) from None
    finally:
        aside.unlink()


def commit_info(operation: str, metadata: Mapping[str, Any], timestamp_ms: int) -> Action:
    """The commitInfo of a commit written here, with the caller's metadata beside it (where
    delta-rs puts `CommitProperties.custom_metadata`)."""
    return {
        "commitInfo": {
            **metadata,
            "timestamp": timestamp_ms,
            "operation": operation,
            "operationParameters": {},
            "engineInfo": "dblog",
        }
    }
