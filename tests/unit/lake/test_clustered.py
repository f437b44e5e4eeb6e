"""The lake's key-range layout: which files a write touches (pure), the rule applied to their
rows (pure), and on real Delta tables (delta-rs, no server) that a fold of keys in one range
rewrites that range's file alone, as the Delta log's add and remove actions show, while
DuckDB and Polars read the same rows; a table of the older layout (files whose ranges overlap)
is rewritten whole where it overlaps, and stays right."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import duckdb
import numpy
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, write_deltalake

from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.event import Op, Origin, PlainEvent, SourceInfo, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake import merge as merge_module
from airflow_provider_dblog.lake import table as table_module
from airflow_provider_dblog.lake.clustered import (
    DataFile,
    Part,
    Touched,
    Write,
    apply_rule,
    merges,
    packed,
    rows_holding,
    touched,
)
from airflow_provider_dblog.lake.direct import commit_staged, stage_rows
from airflow_provider_dblog.lake.schema import LakeRow, LakeSchema, lake_schema
from airflow_provider_dblog.lake.table import LakeTable, table_uri
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput

pytestmark = pytest.mark.unit

TABLE = TableRef("app", "users")
SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema((Column("id", "bigint", False, None), Column("name", "text", True, None)), ("id",)),
)


def test_a_write_touches_the_files_its_keys_fall_in() -> None:
    files = [DataFile("a", 0, 99), DataFile("b", 100, 199), DataFile("c", 300, 399)]
    found = touched(files, [150, 120])
    assert [f.path for f in found.files] == ["b"]
    assert found.ranges == ((100, 199),)
    # a new key in the gap joins the range of its neighbour, none lying between them
    found = touched(files, [150, 250])
    assert found.ranges == ((100, 250),)
    # keys beyond every file: a range of their own, nothing rewritten
    found = touched(files, [500, 900])
    assert found.files == () and found.ranges == ((500, 900),)
    [write] = found.writes("id", 1000)
    assert write == Write('"id" >= 500 AND "id" <= 900', Part(500, 900, ()))
    # keys on both sides of an untouched file: two ranges
    found = touched(files, [50, 350])
    assert [f.path for f in found.files] == ["a", "c"]
    assert found.ranges == ((0, 99), (300, 399))
    a, c = files[0], files[2]
    assert found.writes("id", 1000) == [  # a commit per range: a file across would span b
        Write('"id" >= 0 AND "id" <= 99', Part(0, 99, (a,))),
        Write('"id" >= 300 AND "id" <= 399', Part(300, 399, (c,))),
    ]


def test_a_write_of_many_files_reads_them_a_part_at_a_time_cut_where_none_overlaps() -> None:
    files = [
        DataFile("a", 0, 99, 100),
        DataFile("b", 100, 250, 100),
        DataFile("c", 200, 299, 100),  # overlaps b: never cut between them
        DataFile("d", 300, 399, 100),
    ]
    writes = touched(files, [0, 150, 399]).writes("id", 100)
    assert [(w.predicate, [f.path for f in w.part.files]) for w in writes] == [
        ('"id" >= 0 AND "id" < 100', ["a"]),  # a commit a part, up to the next one's files
        ('"id" >= 100 AND "id" < 300', ["b", "c"]),
        ('"id" >= 300 AND "id" <= 399', ["d"]),
    ]
    assert [(w.part.low, w.part.high, w.part.cut) for w in writes] == [
        (0, 100, True),
        (100, 300, True),
        (300, 399, False),
    ]


def test_files_overlapping_a_touched_one_are_touched_and_no_statistics_means_all() -> None:
    older = [DataFile("x", 0, 500), DataFile("y", 400, 900), DataFile("z", 1000, 1100)]
    found = touched(older, [10])
    assert [f.path for f in found.files] == ["x", "y"]
    assert found.ranges == ((0, 900),)
    blind = [DataFile("x", 0, 500), DataFile("n", None, None)]
    found = touched(blind, [1])
    assert [f.path for f in found.files] == ["x", "n"]
    [write] = found.writes("id", 1000)
    assert write.predicate is None and write.part == Part(None, None, tuple(blind))


@pytest.mark.parametrize(
    "column",
    [[3, 5, 8, 13, 21], [13, 3, 21, 8, 5], [], [8]],
    ids=["sorted", "unsorted", "empty", "one row"],
)
def test_the_rows_holding_keys_are_found_by_search_or_probe(column: list[int]) -> None:
    keys = numpy.array([1, 5, 8, 21, 40])  # sorted; some absent, one past every row
    found = rows_holding(numpy.array(column, dtype=numpy.int64), keys)
    assert found.tolist() == [i for i, value in enumerate(column) if value in keys]


def test_the_rule_on_the_touched_rows_keeps_the_highest_position_sorted() -> None:
    schema = SCHEMA.arrow_schema()
    stored = SCHEMA.to_arrow(
        [LakeRow({"id": 5, "name": "e"}, 10, 0, "c"), LakeRow({"id": 1, "name": "a"}, 10, 0, "c")]
    )
    stored = stored.cast(schema)
    source = SCHEMA.to_arrow(
        [
            LakeRow({"id": 5, "name": "old"}, 9, 0, "r"),  # lower: the stored row stays
            LakeRow({"id": 1}, 12, 0, "u", keep=frozenset({"name"})),  # name kept
            LakeRow({"id": 3, "name": "c"}, 11, 0, "c"),  # new
        ]
    )
    source = pa.Table.from_arrays(
        [source[f.name].cast(f.type) for f in schema] + [source["_dblog_keep:name"]],
        names=[*schema.names, "_dblog_keep:name"],
    )
    rows, inserted, updated = apply_rule(stored, source, ("id",), schema)
    assert rows["id"].to_pylist() == [1, 3, 5]
    assert rows["name"].to_pylist() == ["a", "c", "e"]
    assert rows["_dblog_commit"].to_pylist() == [12, 11, 10]
    assert (inserted, updated) == (1, 1)


def last_commit(root: Path, lake: LakeTable) -> tuple[set[str], list[tuple[int, int]]]:
    """The files the latest commit removed, and the id ranges of those it added."""
    entry = Path(table_uri(root, TABLE)) / "_delta_log" / f"{lake.version:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    added = []
    for action in actions:
        if "add" in action:
            stats = json.loads(action["add"]["stats"])
            added.append((stats["minValues"]["id"], stats["maxValues"]["id"]))
    return removed, added


def files_by_range(lake: LakeTable) -> dict[tuple[int, int], str]:
    actions = pa.table(lake.delta.get_add_actions(flatten=True))
    return {
        (low, high): path
        for path, low, high in zip(
            actions["path"].to_pylist(),
            actions["min.id"].to_pylist(),
            actions["max.id"].to_pylist(),
            strict=True,
        )
    }


def readers_see(
    root: Path, lake: LakeTable, table: TableRef = TABLE, key: str = "id"
) -> dict[Any, str | None]:
    """The current rows (`key` to name) as DuckDB and Polars read them (the same, or the test
    fails)."""
    lake.refresh()
    query = f"SELECT {key}, name FROM read_parquet($files) WHERE NOT _dblog_deleted"
    by_duckdb = dict(duckdb.execute(query, {"files": lake.delta.file_uris()}).fetchall())
    frame = polars.read_delta(table_uri(root, table)).filter(~polars.col("_dblog_deleted"))
    by_polars = dict(zip(frame[key].to_list(), frame["name"].to_list(), strict=True))
    assert by_duckdb == by_polars
    return by_duckdb


def four_ranges(root: Path, schema: LakeSchema = SCHEMA) -> LakeTable:
    """`TABLE` of four direct chunks of 1000 keys named `n<key>`: four files, one range each."""
    for chunk in range(4):
        keys = range(chunk * 1000, chunk * 1000 + 1000)
        handle = stage_rows(root, TABLE, schema, [{"id": k, "name": f"n{k}"} for k in keys])
        hw = Position(100 + chunk, 0)
        record = DirectRecord("w", Position(hw.commit - 1, 0), hw, frozenset())
        commit_staged(root, TABLE, [handle], schema, record, ("id",))
    return LakeTable.open(root, TABLE)


def test_a_fold_of_keys_in_one_range_rewrites_that_ranges_file_alone(tmp_path: Path) -> None:
    root, events = tmp_path / "lake", tmp_path / "events"
    lake = four_ranges(root)
    layout = files_by_range(lake)
    assert sorted(layout) == [(0, 999), (1000, 1999), (2000, 2999), (3000, 3999)]

    def source(commit: int, seq: int) -> SourceInfo:
        return SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG)

    changes = [
        PlainEvent(Op.UPDATE, {"id": 2100}, None, {"id": 2100, "name": "new"}, source(500, 1), 1),
        PlainEvent(Op.DELETE, {"id": 2500}, None, None, source(500, 3), 1),
        PlainEvent(Op.CREATE, {"id": 2999}, None, {"id": 2999, "name": "again"}, source(501, 1), 1),
    ]
    with NdjsonOutput(events) as out:
        out.write(changes, 1)
    report = compact(None, events, root, CompactOptions(describe=lambda table: SCHEMA))
    assert report.events == 3
    lake.refresh()
    removed, added = last_commit(root, lake)
    assert removed == {layout[(2000, 2999)]}
    assert added == [(2000, 2999)]
    seen = readers_see(root, lake)
    assert len(seen) == 3999 and 2500 not in seen
    assert (seen[2100], seen[2999], seen[2101]) == ("new", "again", "n2101")


def test_a_table_of_the_older_layout_is_rewritten_where_it_overlaps(tmp_path: Path) -> None:
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    schema = lake.arrow_schema
    for keys in ([5, 1, 9], [7, 2, 20]):  # unsorted, overlapping: as a delta-rs merge left them
        rows = SCHEMA.to_arrow([LakeRow({"id": k, "name": f"n{k}"}, 10, 0, "c") for k in keys])
        write_deltalake(table_uri(tmp_path, TABLE), rows.cast(schema), mode="append")
    write_deltalake(
        table_uri(tmp_path, TABLE),
        SCHEMA.to_arrow([LakeRow({"id": 50, "name": "n50"}, 10, 0, "c")]).cast(schema),
        mode="append",
    )
    lake.refresh()
    far = files_by_range(lake)[(50, 50)]
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 2, "name": "two"}, 11, 0, "u")]))
    removed, added = last_commit(tmp_path, lake)
    assert len(removed) == 2 and far not in removed
    assert added == [(1, 20)]
    assert readers_see(tmp_path, lake) == {
        1: "n1",
        2: "two",
        5: "n5",
        7: "n7",
        9: "n9",
        20: "n20",
        50: "n50",
    }


MIB = 1024 * 1024


def test_an_optimize_packs_runs_of_neighbouring_small_files_into_ranges() -> None:
    """Small files (under half the target) between two larger ones pack apart; a run stops at
    the target size; a run of one file stays; overlapping files (the older layout) are
    rewritten together, even large."""
    a, b = DataFile("a", 0, 9, size=MIB), DataFile("b", 10, 19, size=MIB)
    big = DataFile("big", 20, 29, size=9 * MIB)
    d, e, f = (DataFile(p, lo, lo + 9, size=3 * MIB) for p, lo in (("d", 30), ("e", 40), ("f", 50)))
    lone = DataFile("lone", 60, 69, size=MIB)
    big2 = DataFile("big2", 70, 79, size=4 * MIB)  # half the target: not small
    assert packed([lone, f, e, d, big, b, a, big2], 8 * MIB) == [
        Touched((a, b), ((0, 19),)),
        Touched((d, e), ((30, 49),)),  # f would make 9 MiB: it starts the next run, with lone
        Touched((f, lone), ((50, 69),)),
    ]
    x, y = DataFile("x", 0, 100, size=5 * MIB), DataFile("y", 50, 150, size=5 * MIB)
    z = DataFile("z", 200, 210, size=MIB)
    assert packed([x, y, z], 8 * MIB) == [Touched((x, y), ((0, 150),))]
    assert packed([a], 8 * MIB) == []
    assert packed([a, b, DataFile("nostats", None, None)], 8 * MIB) is None


def test_an_optimize_with_deletion_vectors_merges_small_files_among_themselves() -> None:
    """Small by the bytes their rows alive take (a write's files spanning every range, a
    range mostly marked deleted), files merge in key order up to the target, whatever they
    overlap; a large range stays, and so does a lone small file unless rows of it are
    deleted."""
    ranges = [DataFile(f"r{i}", i * 100, i * 100 + 99, 100, 6 * MIB) for i in range(4)]
    fold, other = DataFile("fold", 3, 398, 10, MIB), DataFile("other", 7, 390, 10, MIB)
    deleted = {"r1": 60, "r2": 10}  # r1 keeps 2.4 MiB alive: small; r2 5.4 MiB
    assert merges([*ranges, other, fold], deleted, 8 * MIB) == [(fold, other, ranges[1])]
    assert merges([ranges[0], fold], {}, 8 * MIB) == []
    assert merges([ranges[1], ranges[2]], deleted, 8 * MIB) == [(ranges[1],)]
    blind = DataFile("nostats", None, None, 10, MIB)
    many = [DataFile(f"s{i}", i, i, 1, 3 * MIB) for i in range(3)]
    assert merges([*many, blind], {}, 8 * MIB) == [(blind, many[0], many[1])]


def test_an_optimize_keeps_the_ranges_and_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve small files of neighbouring key ranges (1000 rows each), optimized with a target
    of about four files' size: fewer files, still in disjoint key ranges that cover the same
    keys, read the same by DuckDB and Polars; a later write of one key rewrites one file; what
    the optimize wrote is not packed again."""
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    for n in range(12):
        keys = range(n * 1000, n * 1000 + 1000)
        rows = [LakeRow({"id": k, "name": f"name {k}"}, 10 + n, k, "c") for k in keys]
        lake.merge(SCHEMA.to_arrow(rows))
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 1500, "name": "again"}, 30, 0, "u")]))
    before = readers_see(tmp_path, lake)
    sizes = pa.table(lake.delta.get_add_actions(flatten=True))["size_bytes"].to_pylist()
    assert len(sizes) == 12
    for module in (table_module, merge_module):  # the ranges packed, and the files written
        monkeypatch.setattr(module, "FILE_BYTES", int(max(sizes) * 4.5))
    removed, written = lake.optimize(CommitProperties())
    layout = sorted(files_by_range(lake))
    assert removed == 12 and 2 <= written == len(layout) < 12, (removed, written, layout)
    assert all(high < next_low for (_, high), (next_low, _) in pairwise(layout))
    assert (layout[0][0], layout[-1][1]) == (0, 11_999)
    assert readers_see(tmp_path, lake) == before
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 6001, "name": "later"}, 40, 0, "u")]))
    removed_files, added = last_commit(tmp_path, lake)
    assert len(removed_files) == 1 and len(added) == 1
    assert lake.optimize(CommitProperties()) == (0, 0)  # what it wrote is not small


def test_string_keys_make_ranges_and_quoted_predicates() -> None:
    """Strings order by their bytes; a predicate spells them quoted, a quote doubled and a
    backslash as it is."""
    files = [DataFile("a", "a", "azz"), DataFile("b", "b", "bzz"), DataFile("d", "d", "dzz")]
    found = touched(files, ["bz", "b1"])
    assert [f.path for f in found.files] == ["b"]
    assert found.writes("tag", 1000) == [
        Write("\"tag\" >= 'b' AND \"tag\" <= 'bzz'", Part("b", "bzz", (files[1],)))
    ]
    found = touched(files, ["c'q\\", "c"])  # between b and d: a range of its own
    assert found.files == () and found.ranges == (("c", "c'q\\"),)
    [write] = found.writes("tag", 1000)
    assert write.predicate == "\"tag\" >= 'c' AND \"tag\" <= 'c''q\\'"
    found = touched(files, ["a1", "é"])  # é (two UTF-8 bytes) sorts after every ASCII key
    assert [f.path for f in found.files] == ["a"] and found.ranges == (("a", "azz"), ("é", "é"))
    many = [DataFile(p, p, p + "z", 100) for p in ("m", "n", "o")]
    writes = touched(many, ["m", "n1", "o"]).writes("tag", 100)
    assert [w.predicate for w in writes] == [
        "\"tag\" >= 'm' AND \"tag\" < 'n'",
        "\"tag\" >= 'n' AND \"tag\" < 'o'",
        "\"tag\" >= 'o' AND \"tag\" <= 'oz'",
    ]


TAGS = TableRef("app", "tags")
TAGS_SCHEMA = lake_schema(
    "postgres",
    TAGS,
    TableSchema((Column("tag", "text", False, None), Column("name", "text", True, None)), ("tag",)),
)


def test_a_write_of_text_keys_rewrites_the_files_of_their_range_alone(tmp_path: Path) -> None:
    """Four merges of neighbouring text key ranges, with a quote, a backslash, a non-ASCII
    letter and keys longer than delta-rs keeps in a statistic: four files in disjoint ranges;
    a write of keys in one range rewrites that range's file alone, and the readers see every
    row once."""
    lake = LakeTable.open_or_create(tmp_path, TAGS, TAGS_SCHEMA)
    expected: dict[str, str | None] = {}
    for chunk in range(4):
        keys = [f"k{chunk}-{n:03d}" for n in range(100)]
        keys += [f"k{chunk}-050'q", f"k{chunk}-050\\b", f"k{chunk}-050é", f"k{chunk}-" + "x" * 90]
        rows = [
            LakeRow({"tag": k, "name": f"n-{k}"}, 10 + chunk, n, "c") for n, k in enumerate(keys)
        ]
        lake.merge(TAGS_SCHEMA.to_arrow(rows))
        expected |= {k: f"n-{k}" for k in keys}
    actions = pa.table(lake.delta.get_add_actions(flatten=True))
    ranges = sorted(
        zip(actions["min.tag"].to_pylist(), actions["max.tag"].to_pylist(), strict=True)
    )
    assert len(ranges) == 4 and all(high < low for (_, high), (low, _) in pairwise(ranges))
    assert readers_see(tmp_path, lake, TAGS, "tag") == expected

    changed = ["k2-050'q", "k2-" + "x" * 90, "k2-050\\b", "k2-0505"]  # the last one new
    rows = [LakeRow({"tag": k, "name": "changed"}, 50, n, "u") for n, k in enumerate(changed)]
    lake.merge(TAGS_SCHEMA.to_arrow([*rows, LakeRow({"tag": "k2-007"}, 51, 0, "d", deleted=True)]))
    entry = Path(table_uri(tmp_path, TAGS)) / "_delta_log" / f"{lake.version:020d}.json"
    actions_now = [json.loads(line) for line in entry.read_text().splitlines()]
    assert sum(1 for a in actions_now if "remove" in a) == 1
    [added] = [a["add"]["path"] for a in actions_now if "add" in a]
    written = pq.read_table(Path(table_uri(tmp_path, TAGS)) / added)["tag"].to_pylist()
    assert written == sorted(written) and "k2-0505" in written, "rewritten sorted by key"
    assert lake.delta.history(1)[0]["operation"] == "WRITE", "a range write, not a MERGE"
    expected |= dict.fromkeys(changed, "changed")
    del expected["k2-007"]
    assert readers_see(tmp_path, lake, TAGS, "tag") == expected


def test_a_write_of_many_parts_leaves_files_in_disjoint_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold of keys all over a table rewrites it a part at a time, a commit a part, each
    part one record batch: delta-rs spreads the batches of one write over its writer tasks,
    whose files would interleave their key ranges, and every later write touch several."""
    monkeypatch.setattr(merge_module, "PART_ROWS", 4000)
    monkeypatch.setattr(merge_module, "FILE_BYTES", 48 * 1024)
    batches = []
    real = merge_module.write_deltalake

    def counted(table: Any, data: Any, **options: Any) -> None:
        batches.append(len(pa.table(data).to_batches()))
        real(table, data, **options)

    monkeypatch.setattr(merge_module, "write_deltalake", counted)
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    keys = range(40_000)
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": k, "name": f"n{k}"}, 10, k, "c") for k in keys]))
    first = lake.version
    changed = range(0, 40_000, 97)
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": k, "name": "new"}, 20, k, "u") for k in changed]))
    layout = sorted(files_by_range(lake))
    assert len(layout) >= 8 and lake.version - first >= 5, "several parts, a commit each"
    key = pq.ParquetFile(urlparse(lake.delta.file_uris()[0]).path).metadata
    assert key.row_group(0).column(0).encodings == ("RLE", "DELTA_BINARY_PACKED")
    assert key.row_group(0).column(0).compression == "SNAPPY"
    assert set(batches) == {1}, batches
    assert all(high < low for (_, high), (low, _) in pairwise(layout)), layout
    assert readers_see(tmp_path, lake) == {k: "new" if k % 97 == 0 else f"n{k}" for k in keys}
