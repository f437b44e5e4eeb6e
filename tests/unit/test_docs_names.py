"""Every name the docs give the reader resolves, so the docs cannot drift from the code.

`test_docs_reference.py` checks the flags of backticked `dblog` synopses, the ```toml blocks, the
error types, dotted code names and file paths of the README and `docs/`. This adds what it
leaves out: the other docs (`CONTRIBUTING.md`, `bench/README.md`) for dotted names and paths;
class names written alone (`WindowStore`); the `dblog` commands every doc names, in prose and
in shell blocks, with the flags, long or short, a shell line gives them; `[section] key` in
prose; and the `DBLOG_*` environment variables.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from airflow_provider_dblog.config import _LAKE_KEYS
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.tailer.settings import TailerSettings
from airflow_provider_dblog.targets import _OUTPUTS
from tests.unit.test_docs_reference import (
    CODE_NAME,
    DBLOG,
    FILE_PATH,
    FILE_SUFFIXES,
    NOT_CODE,
    _known_redis_keys,
    _resolves,
    build_parser,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ALL_DOCS = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    REPO / "bench" / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
]
OTHER_DOCS = [REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md"]
"""The docs `test_docs_reference.py` does not read."""
CODE_ROOTS = ["airflow_provider_dblog", "spark_jobs", "bench", "tests", "dags", "scripts"]

CLASS_NAME = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)`")
"""A backticked CamelCase name written alone: `WindowStore`, `LakeTable`."""
EXTERNAL_CLASSES = {
    "AirflowFailException": "airflow.exceptions",
    "ApprovalOperator": "airflow.providers.standard.operators.hitl",
    "AssetWatcher": "airflow.sdk",
    "BinLogStreamReader": "pymysqlreplication",
    "CollectorRegistry": "prometheus_client",
    "CommitFailedError": "deltalake.exceptions",
    "DeltaTable": "deltalake",
    "QueryBuilder": "deltalake",
    "MessageQueueTrigger": "airflow.providers.common.messaging.triggers.msg_queue",
    "SparkSubmitHook": "airflow.providers.apache.spark.hooks.spark_submit",
    "TriggerEvent": "airflow.triggers.base",
}
"""Other projects' classes the docs name, by the module that has them."""
NOT_PYTHON = {
    "DeltaCatalog": "Delta Lake's Spark catalog (a JVM class)",
    "DeltaSparkSessionExtension": "Delta Lake's Spark extension (a JVM class)",
}
OUR_SECTIONS = {"source", "redis", "output", "tailer", "lake"}
"""TOML sections of ours; `[api]`, `[core]` and the like are Airflow's."""


def _code_files() -> list[Path]:
    return [p for root in CODE_ROOTS for p in (REPO / root).rglob("*.py")]


def _defined_names() -> set[str]:
    """Every class, function and assigned name defined anywhere in our code, nested too."""
    names: set[str] = set()
    for path in _code_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _read(doc: Path) -> str:
    return doc.read_text()


def test_every_class_the_docs_name_exists() -> None:
    defined = _defined_names()
    missing: dict[str, set[str]] = {}
    for doc in ALL_DOCS:
        for name in CLASS_NAME.findall(_read(doc)):
            if name in defined or name in NOT_PYTHON:
                continue
            module = EXTERNAL_CLASSES.get(name)
            if module is not None and hasattr(importlib.import_module(module), name):
                continue
            missing.setdefault(name, set()).add(str(doc.relative_to(REPO)))
    assert not missing, f"the docs name classes no code defines: {missing}"


def test_the_dotted_names_and_paths_of_the_other_docs_exist() -> None:
    """What `test_docs_reference.py` checks in `docs/`, in the docs it does not read."""
    missing: dict[str, str] = {}
    roots = [REPO, REPO / "airflow_provider_dblog", REPO / "tests", REPO / "bench"]
    for doc in OTHER_DOCS:
        text = _read(doc)
        for name in CODE_NAME.findall(text):
            if name.endswith(FILE_SUFFIXES) or name in NOT_CODE:
                continue
            if not _resolves(name):
                missing[name] = doc.name
        for path in FILE_PATH.findall(text):
            if not any((root / path).exists() for root in roots):
                missing[path] = doc.name
    assert not missing, f"names and paths that do not exist: {missing}"


GROUPS = {c.split()[0] for c in DBLOG if " " in c}
"""`lake`, `dev-services`: the first word of a command of two."""


def _option_strings(command: str) -> set[str]:
    """Every option string, long and short, of `dblog <command>`."""
    parser = build_parser()
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return {o for a in parser._actions for o in a.option_strings}


def _command_of(words: list[str]) -> str | None:
    """The command `dblog <words...>` runs, or None when the words name none."""
    if not words:
        return None
    first = words[0]
    if first in GROUPS:
        second = words[1] if len(words) > 1 else ""
        return f"{first} {second}" if f"{first} {second}" in DBLOG else None
    return first if first in DBLOG else None


def _shell_lines(text: str) -> list[str]:
    """The lines of ```bash and ```sh blocks, and the indented command lines of the docs."""
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        lines += block.splitlines()
    lines += [line[4:] for line in text.splitlines() if line.startswith("    .venv/bin/")]
    return lines


DBLOG_CALL = re.compile(r"(?:^|[\s`(])(?:\.venv/bin/)?dblog ([a-z][\w|-]*(?: [a-z][\w|-]*)?)")


def test_every_dblog_command_the_docs_name_exists() -> None:
    """`dblog tail`, `dblog lake maintain`, `dblog pause|resume|cancel`: in prose and in shell
    lines, every `dblog` word that names a command names one the CLI has."""
    unknown: dict[str, set[str]] = {}
    for doc in ALL_DOCS:
        for span in re.findall(r"`dblog ([^`]+)`", _read(doc)):
            words = span.split()
            heads = words[0].split("|")
            if words[0] in GROUPS and len(words) > 1:
                heads = [f"{words[0]} {w}" for w in words[1].split("|")]
            elif words[0] not in GROUPS and not re.fullmatch(r"[a-z][a-z|-]*", words[0]):
                continue
            for head in heads:
                if head not in DBLOG and head not in GROUPS:
                    unknown.setdefault(head, set()).add(doc.name)
        for line in _shell_lines(_read(doc)):
            for call in DBLOG_CALL.findall(line.split("#")[0]):
                if _command_of(call.split()) is None and call.split()[0] not in GROUPS:
                    unknown.setdefault(call, set()).add(doc.name)
    assert not unknown, f"the docs name dblog commands the CLI lacks: {unknown}"


def test_every_flag_on_a_shell_line_is_its_command_s() -> None:
    """`dblog tail -c dblog.toml`: the flags, short ones too, of each `dblog` call in a shell
    block belong to the command it runs."""
    wrong: dict[str, set[str]] = {}
    for doc in ALL_DOCS:
        for line in _shell_lines(_read(doc)):
            code = line.split(" #")[0]
            for match in re.finditer(
                r"(?:^|\s)(?:\.venv/bin/)?dblog ((?:[a-z][\w-]* ?){1,2})", code
            ):
                command = _command_of(match.group(1).split())
                if command is None:
                    continue
                rest = code[match.end() :].split("|")[0].split(">")[0].split("&&")[0]
                flags = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest))
                unknown = flags - _option_strings(command)
                if unknown:
                    wrong.setdefault(f"dblog {command}", set()).update(unknown)
    assert not wrong, f"shell lines give dblog commands flags they lack: {wrong}"


def _known_keys(tmp_path: Path) -> dict[str, set[str]]:
    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    return {
        "source": {"type"} | fields(PostgresSourceConfig) | fields(MysqlSourceConfig),
        "redis": _known_redis_keys(tmp_path),
        "output": {"type"}.union(*(names for _, names in _OUTPUTS.values())),
        "tailer": fields(TailerSettings),
        "lake": set(_LAKE_KEYS),
    }


def test_every_section_key_the_docs_name_in_prose_exists(tmp_path: Path) -> None:
    """`[source] unique_keys`, `[tailer] heartbeat_s`: a key named with its section is a key
    of that section (`[api] base_url` and other sections not ours are Airflow's)."""
    known = _known_keys(tmp_path)
    unknown: dict[str, set[str]] = {}
    for doc in ALL_DOCS:
        text = _read(doc).replace("`\n", "` ").replace("\n", " ")
        for section, key in re.findall(r"`\[(\w+)\]`? `?([a-z_]+)`", text):
            if section in OUR_SECTIONS and key not in known[section]:
                unknown.setdefault(f"[{section}] {key}", set()).add(doc.name)
        named = set(re.findall(r"\[(\w+)\]", " ".join(re.findall(r"`\[\w+\][^`]*`", text))))
        assert named - OUR_SECTIONS <= {"api", "core"}, f"{doc.name}: sections {named}"
    assert not unknown, f"the docs name keys no section has: {unknown}"


def test_every_dblog_environment_variable_the_docs_name_is_read_somewhere() -> None:
    """`DBLOG_CONN_ID`, `DBLOG_TEST_PATIENCE`: each variable the docs tell the reader to set
    is spelled in the code, the DAGs, the scripts or the compose stack."""
    code = "\n".join(p.read_text() for p in _code_files())
    code += "\n".join(
        p.read_text() for p in (REPO / "docker").rglob("*") if p.is_file() and p.suffix != ".md"
    )
    code += (REPO / "scripts" / "test.sh").read_text()
    unknown: dict[str, set[str]] = {}
    for doc in ALL_DOCS:
        for name in re.findall(r"\bDBLOG_[A-Z0-9_]*[A-Z0-9]\b", _read(doc)):
            if name not in code:
                unknown.setdefault(name, set()).add(doc.name)
    assert not unknown, f"the docs name variables nothing reads: {unknown}"
