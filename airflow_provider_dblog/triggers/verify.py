"""Following a verify run (`dblog verify`, started detached by `DBLogVerifyOperator`) to its end,
and what its end says: `VerifyOutcome`, the trigger event's payload and the operator's XCom.

The run's process holds a claim on it while it runs (`VerifyStore.claim`), its repair included,
and while it is paused; the wait ends once no process holds it and the run is finished (done,
failed or cancelled; and its repair, when one was asked, recorded with every dump of it
finished), or once no process has held it for `runner_timeout_s` (the process died: a retry of
the task resumes the run).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.state.verifies import COUNTERS

FIRST_KEYS = 20
"""Differing keys an outcome names (all of them stay in the store)."""

STALLED = "stalled"
"""`outcome` of a wait given up: no process has run the verify for too long."""


@dataclass(frozen=True)
class VerifyOutcome:
    """A verify run as a wait for it ended: small and fixed, no secret.

    :param verify_id: the run.
    :param outcome: `done`, `failed`, `cancelled`, `missing` (no such run) or `stalled`.
    :param reason: why it failed, as the run recorded it.
    :param counts: each of `COUNTERS` summed over the run's tables.
    :param first_keys: the first differing keys, each `table kind [key]`.
    :param repair: the repair, when the run has one: `removed` (extra keys removed) and
        `dumps` (each key dump's `dump_id`, `state` and `rows`).
    """

    verify_id: str
    outcome: str
    reason: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    first_keys: list[str] = field(default_factory=list)
    repair: dict[str, Any] | None = None

    @property
    def differing(self) -> int:
        return sum(self.counts.get(c, 0) for c in COUNTERS[2:])

    @property
    def repaired(self) -> bool:
        """A repair was recorded and every dump of it is done."""
        return self.repair is not None and all(d["state"] == "done" for d in self.repair["dumps"])

    @classmethod
    def of(cls, store: StateStore, verify_id: str, outcome: str | None = None) -> VerifyOutcome:
        """The run as the store holds it now; `outcome` defaults to its state (or `missing`)."""
        status = store.verifies.status(verify_id)
        if status is None:
            return cls(verify_id, outcome or "missing", "no such verify run")
        counts = dict.fromkeys(COUNTERS, 0)
        for per_table in store.verifies.counts(verify_id).values():
            for counter in COUNTERS:
                counts[counter] += per_table[counter]
        first = [
            f"{d.table} {d.kind} {list(d.key)}"
            for d in store.verifies.differences(verify_id, FIRST_KEYS)
        ]
        repair = None
        if status.repair_dumps is not None:
            dumps = []
            for dump_id in status.repair_dumps:
                dumped = store.dumps.status(dump_id)
                state = "missing" if dumped is None else dumped.state.value
                dumps.append(
                    {
                        "dump_id": dump_id,
                        "state": state,
                        "rows": 0 if dumped is None else dumped.rows,
                    }
                )
            repair = {"removed": status.removed, "dumps": dumps}
        return cls(verify_id, outcome or status.state.value, status.reason, counts, first, repair)

    def to_event(self) -> dict[str, Any]:
        """The JSON payload of a trigger event (and the verify operator's XCom), with a
        `report` in Markdown: the counts and the first differing keys, what a person deciding
        on a repair reads."""
        return {**asdict(self), "differing": self.differing, "report": self.report()}

    @classmethod
    def from_event(cls, payload: Mapping[str, Any]) -> VerifyOutcome:
        return cls(
            verify_id=payload["verify_id"],
            outcome=payload["outcome"],
            reason=payload.get("reason") or "",
            counts={k: int(v) for k, v in (payload.get("counts") or {}).items()},
            first_keys=list(payload.get("first_keys") or []),
            repair=payload.get("repair"),
        )

    def report(self) -> str:
        counts = " | ".join(f"{c.replace('_', ' ')}: {self.counts.get(c, 0)}" for c in COUNTERS)
        lines = [f"Verify run `{self.verify_id}`: {self.outcome}. {counts}."]
        if self.first_keys:
            lines += ["", f"The first {len(self.first_keys)} of {self.differing} differing keys:"]
            lines += [f"- `{key}`" for key in self.first_keys]
        if self.repair is not None:
            dumps = ", ".join(f"`{d['dump_id']}` ({d['state']}, {d['rows']} rows)"
                              for d in self.repair["dumps"])  # fmt: skip
            lines += [
                "",
                f"Repair: {self.repair['removed']} extra keys removed; {dumps or 'no dump'}.",
            ]
        return "\n".join(lines)


def finished(store: StateStore, verify_id: str, repair: bool) -> bool:
    """Whether the run (and its repair, when `repair`) has nothing left for a process to do:
    the run failed or was cancelled, or it is done without a repair asked, or with its repair
    recorded and every dump of it finished. (A repair that stopped before it recorded anything
    is not finished: its process ended, and the caller's timeout judges.)"""
    status = store.verifies.status(verify_id)
    if status is None or not status.state.finished:
        return False
    if status.state is not VerifyState.DONE or not repair:
        return True
    if status.repair_dumps is None:
        return False
    for dump_id in status.repair_dumps:
        dumped = store.dumps.status(dump_id)
        if dumped is None or not dumped.state.finished:
            return False
    return True


class DBLogVerifyTrigger(BaseTrigger):
    """Fires when a verify run (with its repair when `repair`) has finished and no process
    runs it, or when none has run it for `runner_timeout_s` (outcome `stalled`), with a
    `VerifyOutcome` payload. Logs the run's chunks and counts as they move.

    :param dblog_conn_id: the `dblog` connection.
    :param verify_id: the run to follow.
    :param repair: whether its repair was asked for.
    :param poll_interval: seconds between polls of Redis.
    :param runner_timeout_s: how long the run may go without a process (from the trigger's
        start, so a process still starting is not taken for dead).
    """

    def __init__(
        self,
        dblog_conn_id: str,
        verify_id: str,
        repair: bool = False,
        poll_interval: float = 5.0,
        runner_timeout_s: float = 120.0,
    ) -> None:
        super().__init__()
        self.dblog_conn_id = dblog_conn_id
        self.verify_id = verify_id
        self.repair = repair
        self.poll_interval = poll_interval
        self.runner_timeout_s = runner_timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "dblog_conn_id": self.dblog_conn_id,
                "verify_id": self.verify_id,
                "repair": self.repair,
                "poll_interval": self.poll_interval,
                "runner_timeout_s": self.runner_timeout_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = await DBLogHook.async_store(self.dblog_conn_id)
        last_seen = time.monotonic()
        logged: tuple[Any, ...] = ()
        while True:
            # A look only after a poll interval: an event that comes while the deferring
            # task's process is still exiting races its executor's report of that try, and
            # the scheduler then fails the resumed task (Airflow 3.3, LocalExecutor).
            await asyncio.sleep(self.poll_interval)
            runner = await asyncio.to_thread(store.verifies.runner, self.verify_id)
            if runner is not None:
                last_seen = time.monotonic()
            elif await asyncio.to_thread(finished, store, self.verify_id, self.repair):
                outcome = await asyncio.to_thread(VerifyOutcome.of, store, self.verify_id)
                yield TriggerEvent(outcome.to_event())
                return
            elif time.monotonic() - last_seen > self.runner_timeout_s:
                outcome = await asyncio.to_thread(VerifyOutcome.of, store, self.verify_id, STALLED)
                yield TriggerEvent(outcome.to_event())
                return
            status = await asyncio.to_thread(store.verifies.status, self.verify_id)
            if status is not None and (status.state, status.chunks) != logged:
                logged = (status.state, status.chunks)
                self.log.info("verify %s: %s, %d chunks", self.verify_id, *logged)
