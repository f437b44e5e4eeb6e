"""Every bad input to `dblog dump` is refused before anything is stored.

Hypothesis draws bad command-line arguments (sizes, rates, ids, table names, key lists on a
bigint, a composite `(text, int)` and a uuid key) and bad TOML files (each key of `[source]`,
`[redis]` and `[tailer]` given a wrong type or value), each with the one field it spoils. Every
one must exit 2 with a message naming that field, leave the store's dump list as it was, and
leave a running dump (its status, controls, progress and driver) untouched. The key values are
judged by the real PostgreSQL (`ChunkSource.check_keys`), so the cases run against real
servers; the commands run in this process (`cli.main`), which keeps each example cheap.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.request import build_request
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.e2e_support import (
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    Databases,
    drop_databases,
    make_databases,
)

pytestmark = pytest.mark.integration
EXAMPLES = settings(
    max_examples=int(os.environ.get("DBLOG_FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RUNNING = "running-elsewhere"
DRIVER = "elsewhere:1"


@dataclass
class Setup:
    dbs: Databases
    store: StateStore
    redis: RedisInfo
    work: Path
    good: dict[str, dict[str, Any]]

    def write(self, sections: dict[str, dict[str, Any]], name: str = "dblog.toml") -> Path:
        path = self.work / name
        path.write_text(toml(sections))
        return path

    def snapshot(self) -> object:
        """Everything a bad command could have changed in the store."""
        dumps = self.store.dumps
        return (
            dumps.ids(),
            dumps.status(RUNNING),
            dumps.controls(RUNNING),
            dumps.load_progress(RUNNING),
            dumps.driver(RUNNING),
        )


@pytest.fixture(scope="module")
def setup(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    """A source set up for dumps (its watermark table made as `dblog tail` makes it) with the
    three demo tables and one without a primary key, and a dump of it that another process is
    running."""
    dbs = make_databases(pg15, 20, target=False, seed_value=7)
    os.environ[REDIS_PASSWORD_ENV] = redis_server.password
    try:
        dbs.source.ensure_setup()
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.loose (v int)")
        good = {
            "source": {
                "type": "postgres",
                "name": dbs.config.name,
                "dsn": f"host={pg15.host} port={pg15.port} dbname={dbs.source_db} user={pg15.user}",
                "password_env": PASSWORD_ENV,
                "tables": [str(t) for t in dbs.config.tables],
                "slot": dbs.slot,
            },
            "redis": {
                "url": f"redis://{redis_server.host}:{redis_server.port}/{redis_server.db}",
                "password_env": REDIS_PASSWORD_ENV,
            },
            "output": {"type": "ndjson", "directory": "events"},
            "tailer": {"window_ttl_s": 30},
        }
        store = StateStore(redis_server.client(), dbs.config.name)
        accounts = TableRef("public", "accounts")
        store.dumps.create(DumpRequest(RUNNING, DumpKind.TABLE, (accounts,)), {accounts: ("id",)})
        store.dumps.mark(RUNNING, DumpState.RUNNING)
        store.dumps.save_progress(RUNNING, TableProgress(accounts, started=True, chunks_done=2))
        store.dumps.throttle(RUNNING, max_rows_per_s=50)
        store.dumps.beat(RUNNING, DRIVER, 3_600_000)
        yield Setup(dbs, store, redis_server, tmp_path_factory.mktemp("fuzz"), good)
    finally:
        drop_databases(dbs)


def toml(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, section in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in section.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):  # JSON's escapes are TOML's; TOML also wants DEL escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


def run(*argv: str) -> tuple[int, str]:
    """`dblog ARGV` in this process: its exit status and what it wrote to stderr."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse refusing an option value
            code = int(exit_.code or 0)
    return code, err.getvalue()


def refused(setup: Setup, argv: list[str], field: str) -> None:
    before = setup.snapshot()
    code, said = run(*argv)
    assert code == 2, (argv, code, said)
    assert "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    assert re.match(r"dblog( [a-z-]+)?: error: ", last), said
    assert re.search(field, last), f"{argv}: the message does not name {field!r}: {said}"
    assert setup.snapshot() == before, f"{argv} changed the store"


# -- the command line ------------------------------------------------------------------------

TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
"""What a shell can pass as one argument."""
INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
NUMBER = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?\s*", re.IGNORECASE)


def not_integer(minimum: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(max_value=minimum - 1).map(str),
        TEXT.filter(lambda t: not INTEGER.fullmatch(t)),
    )


def not_number(minimum: float) -> st.SearchStrategy[str]:
    return st.one_of(
        st.floats(max_value=minimum, exclude_max=True, allow_nan=False).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "1e999"]),
        TEXT.filter(lambda t: not NUMBER.fullmatch(t)),
    )


def _keys_with(bad: str) -> str:
    """A bigint key list, valid but for one value."""
    return f"1, 2, {bad}, 3"


CAPTURED = {"public.accounts", "public.orders", "public.items", "accounts", "orders", "items"}

BAD_ARGUMENTS = st.one_of(
    not_integer(1).map(lambda v: (["--chunk-size", v], "--chunk-size")),
    not_integer(1).map(lambda v: (["--parallelism", v], "--parallelism")),
    not_number(0).map(lambda v: (["--max-rows-per-s", v], "--max-rows-per-s")),
    not_number(0).map(lambda v: (["--source-patience", v], "--source-patience")),
    st.one_of(not_number(0), st.just("0")).map(
        lambda v: (["--window-timeout", v], "--window-timeout")
    ),
    st.deferred(lambda: BAD_ID).map(lambda v: (["--dump-id", v], "--dump-id")),
    TEXT.filter(lambda t: t.strip() not in CAPTURED).map(lambda v: (["--table", v], "table")),
    TEXT.filter(lambda t: "," not in t and not INTEGER.fullmatch(t)).map(
        lambda v: (["--table", "public.accounts", "--keys", _keys_with(v)], "key")
    ),
    st.integers(min_value=2**63).map(
        lambda v: (["--table", "accounts", "--keys", _keys_with(str(v))], "column id.*bigint")
    ),
    st.one_of(
        TEXT.filter(lambda t: not t.strip().startswith(("[", "{"))),
        st.one_of(
            st.lists(st.one_of(st.integers(), TEXT), max_size=1),
            st.lists(st.one_of(st.integers(), TEXT), min_size=3, max_size=3),
        ).map(lambda k: json.dumps([k])),
        TEXT.filter(lambda t: not INTEGER.fullmatch(t)).map(lambda n: json.dumps([["eu", n]])),
    ).map(lambda v: (["--table", "public.orders", "--keys", v], "key|JSON")),
    TEXT.filter(lambda t: "," not in t).map(
        lambda v: (["--table", "items", "--keys", f"{v}"], "key")
    ),
    st.just((["--keys", "1"], "--keys needs --table")),
    st.just((["--resume"], "--resume needs --dump-id")),
    st.just((["--dump-id", "nobody", "--resume"], "no dump nobody")),
    st.just((["--dump-id", RUNNING, "--max-rows-per-s", "1"], f"running in {DRIVER}")),
    st.just((["--dump-id", RUNNING, "--table", "orders"], f"--dump-id {RUNNING} is a dump of")),
)


BAD_ID = TEXT.filter(lambda t: not re.fullmatch(r"[A-Za-z0-9_.:-]{1,200}", t))
BAD_CONTROLS = st.one_of(
    not_integer(1).map(lambda v: (["throttle", RUNNING, "--chunk-size", v], "--chunk-size")),
    not_integer(0).map(lambda v: (["throttle", RUNNING, "--delay-ms", v], "--delay-ms")),
    not_number(0).map(lambda v: (["throttle", RUNNING, "--max-rows-per-s", v], "--max-rows-per-s")),
    st.tuples(st.sampled_from(["pause", "resume", "cancel", "throttle"]), BAD_ID).map(
        lambda c: ([c[0], c[1]], "dump_id")
    ),
    BAD_ID.map(lambda v: (["status", "--dump", v], "--dump")),
    st.just((["status", "--dump", "nobody"], "no dump nobody")),
)
"""Bad values for the commands that act on a running dump, aimed at the running one."""


@EXAMPLES
@given(case=BAD_ARGUMENTS)
def test_bad_dump_arguments_exit_2_naming_the_field_and_store_nothing(
    setup: Setup, case: tuple[list[str], str]
) -> None:
    arguments, field = case
    config = setup.write(setup.good)
    refused(setup, ["dump", "-c", str(config), *arguments], field)


@EXAMPLES
@given(case=BAD_CONTROLS)
def test_bad_control_arguments_exit_2_and_leave_the_running_dump_alone(
    setup: Setup, case: tuple[list[str], str]
) -> None:
    (command, *arguments), field = case
    config = setup.write(setup.good)
    refused(setup, [command, "-c", str(config), *arguments], field)


def test_every_bad_key_is_named_in_one_refusal(setup: Setup) -> None:
    """A key of the wrong shape and keys whose values their column refuses, all at once."""
    config = setup.write(setup.good)
    keys = '[["eu", 7], ["us"], ["eu", "x"], ["us", 8], ["us", "1.5"]]'
    refused(
        setup,
        ["dump", "-c", str(config), "--table", "orders", "--keys", keys],
        r"key #2 of public\.orders has 1 value\(s\), .*; key #3: key value 'x' is not a valid "
        r"integer for column n .*; key #5: key value '1\.5' is not a valid integer",
    )


def test_good_keys_pass_the_same_checks_normalised(setup: Setup) -> None:
    """The counterpart that keeps the cases honest: good keys of each kind pass, as the
    database normalises them."""
    config = load_config(setup.write(setup.good))
    chunks = source_for(config.source).chunk_source()
    try:
        for table, keys, normalised in (
            ("public.accounts", " 1, 02 ,1", ((1,), (2,))),
            ("orders", '[["eu", "7"], {"n": 7, "region": "eu"}]', (("eu", 7),)),
            (
                "items",
                "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
                (("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",),),
            ),
        ):
            request, _ = build_request(
                config,
                chunks,
                dump_id="ok",
                tables=[table],
                keys=keys,
                chunk_size=5,
                parallelism=1,
            )
            assert request.keys == normalised
    finally:
        chunks.close()


# -- the TOML file ---------------------------------------------------------------------------

NOT_TEXT = st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2))
NOT_NUMBER = st.one_of(st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2))


def spoil(section: str, key: str, values: st.SearchStrategy[Any], field: str) -> Any:
    return values.map(lambda v: ({section: {key: v}}, field))


def without(section: str, key: str | None = None) -> Any:
    return st.just(({section: {key: None} if key else None}, section if key is None else key))


BAD_TOML = st.one_of(
    spoil("source", "name", st.one_of(NOT_TEXT, st.just("")), "name"),
    spoil("source", "dsn", st.one_of(NOT_TEXT, st.sampled_from(["=", "host"])), "dsn"),
    spoil("source", "dsn", st.just("host=127.0.0.1 port=1 dbname=x user=y"), "dsn"),
    spoil("source", "dsn", st.just("host=h password=secret"), "dsn"),
    spoil(
        "source",
        "password_env",
        st.one_of(NOT_TEXT, TEXT.filter(lambda t: not re.fullmatch(r"[A-Za-z_]\w*", t))),
        "password_env",
    ),
    spoil("source", "password_env", st.just("DBLOG_FUZZ_UNSET"), "DBLOG_FUZZ_UNSET"),
    spoil(
        "source",
        "tables",
        st.one_of(
            st.text(max_size=5),
            st.just([]),
            st.lists(NOT_TEXT, min_size=1, max_size=2),
            st.just(["public.nope"]),
            st.just(["a.b.c"]),
        ),
        "tables|table",
    ),
    spoil(
        "source",
        "tables",
        st.just(["public.accounts", "public.loose"]),
        "public.loose has no primary key",
    ),
    spoil("source", "slot", st.one_of(NOT_TEXT, st.just("Bad-Slot"), st.just("")), "slot"),
    spoil(
        "source",
        "replica_identity_full",
        st.one_of(st.text(max_size=3), st.integers()),
        "replica_identity_full",
    ),
    spoil("source", "type", st.sampled_from(["oracle", "", "Postgres"]), "type"),
    spoil("source", "watermark_schema", st.just("nowhere"), "dblog tail"),
    spoil("source", "slots", st.integers(), "slots"),
    spoil(
        "redis", "url", st.one_of(NOT_TEXT, st.sampled_from(["", "http://x", "localhost"])), "url"
    ),
    spoil("redis", "url", st.sampled_from(["redis://h:port/0", "redis://h:6379/abc"]), "url"),
    spoil("redis", "url", st.just("redis://127.0.0.1:1/0"), "Redis.*127.0.0.1:1"),
    spoil("redis", "password_env", st.one_of(NOT_TEXT, st.just("no good")), "password_env"),
    spoil("redis", "port", st.integers(), "port"),
    spoil("tailer", "window_ttl_s", st.one_of(NOT_NUMBER, st.floats(max_value=0)), "window_ttl_s"),
    spoil(
        "tailer",
        "batch_events",
        st.one_of(NOT_NUMBER, st.floats(1, 10), st.integers(max_value=0)),
        "batch_events",
    ),
    spoil("tailer", "window_ttl", st.floats(1, 10), "window_ttl"),
    without("source"),
    without("redis"),
    without("output"),
    without("source", "dsn"),
    without("source", "tables"),
    st.sampled_from(["source", "redis", "tailer"]).map(lambda s: ({s: 5}, s)),
)


@EXAMPLES
@given(case=BAD_TOML)
def test_a_bad_toml_exits_2_naming_the_field_and_stores_nothing(
    setup: Setup, case: tuple[dict[str, Any], str]
) -> None:
    change, field = case
    sections: dict[str, Any] = {name: dict(section) for name, section in setup.good.items()}
    for name, section in change.items():
        if section is None:
            del sections[name]
        elif not isinstance(section, dict):
            sections[name] = section
        else:
            for key, value in section.items():
                if value is None:
                    del sections[name][key]
                else:
                    sections[name][key] = value
    path = setup.work / "bad.toml"
    path.write_text(
        "\n".join(f"{n} = {toml_value(s)}" for n, s in sections.items() if not isinstance(s, dict))
        + "\n"
        + toml({n: s for n, s in sections.items() if isinstance(s, dict)})
    )
    # A store it cannot reach is waited for within the patience, then refused: 1 s here.
    refused(setup, ["dump", "-c", str(path), "--source-patience", "1"], field)
