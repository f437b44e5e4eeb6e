"""A verify run's chunks as the dump's planner plans them: the last range chunk reads to the end
of the range asked, and the verdicts of chunks that end out of order are given back in the
order the planner's progress moves past them, each once."""

from __future__ import annotations

from airflow_provider_dblog.core.dump_plan import Chunk, TablePlanner, TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import ChunkVerdict
from airflow_provider_dblog.verify.runner import VerdictsInOrder, to_range_end

ACCOUNTS = TableRef("public", "accounts")


def verdict(checked: int) -> ChunkVerdict:
    return ChunkVerdict(checked, 0, ())


def test_verdicts_are_given_back_as_progress_moves_past_their_chunks() -> None:
    planner = TablePlanner(TableProgress(ACCOUNTS), 10, bounded=True)
    planner.begin((100,))
    chunks = planner.next_chunks(3, [(10,), (20,)])
    assert [(c.after, c.upto) for c in chunks] == [(None, (10,)), ((10,), (20,)), ((20,), (100,))]
    in_order = VerdictsInOrder()
    for chunk in chunks:
        in_order.started(chunk.seq)

    saved: list[tuple[list[int], TableProgress]] = []
    for seq in (2, 1, 0):  # the last planned ends first
        planner.complete(chunks[seq], seq + 1, None)
        given = in_order.ended(seq, verdict(seq + 1))
        progress = TableProgress.from_json(planner.progress.to_json())
        saved.append(([v.checked for v in given], progress))

    assert [checked for checked, _ in saved] == [[], [], [1, 2, 3]]
    assert saved[0][1].after is None and saved[1][1].after is None, "held, not saved"
    assert saved[2][1].after == (100,) and saved[2][1].done


def test_a_chunk_that_ends_in_order_is_given_back_at_once() -> None:
    in_order = VerdictsInOrder()
    for seq in (0, 1, 2):
        in_order.started(seq)
    assert [v.checked for v in in_order.ended(0, verdict(5))] == [5]
    assert in_order.ended(2, verdict(7)) == []
    assert [v.checked for v in in_order.ended(1, verdict(6))] == [6, 7]


def test_the_last_range_chunk_reads_to_the_end_of_the_range_asked() -> None:
    last = Chunk(ACCOUNTS, 3, after=(20,), upto=(100,))
    assert to_range_end(last, (100,), None).upto is None
    assert to_range_end(last, (100,), (500,)).upto == (500,)
    middle = Chunk(ACCOUNTS, 2, after=(10,), upto=(20,))
    assert to_range_end(middle, (100,), None) == middle
    keys = Chunk(ACCOUNTS, 0, keys=((1,), (2,)))
    assert to_range_end(keys, None, None) == keys
