"""How a wait ended: for a dump, what the dump trigger sends and the dump operator and sensor
read; for the tailer's health, what the health trigger sends and the health sensor reads;
whether they waited in the triggerer or in their own process.

On the wire each is a small JSON object of fixed keys (trigger events are stored in Airflow's
database; operators and sensors return it as their XCom): ids, a state, a reason, counters and
the tailer's heartbeat, never a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_dblog.state import DumpState, DumpStatus, TailerHealth

MISSING = "missing"
"""`outcome` of a wait for a dump the state store does not hold."""
STALLED = "stalled"
"""`outcome` of a wait given up because no process has run the dump for too long."""
ENDED = "ended"
"""`outcome` of a wait for spark-submit run in the task's own process: it exited."""


@dataclass(frozen=True)
class DumpOutcome:
    """A dump as a wait for it ended.

    :param dump_id: the dump.
    :param outcome: what ended the wait: the dump's final state (`done`, `failed`,
        `cancelled`), `missing`, `stalled` or `ended`.
    :param state: the dump's state then; None if the store holds no such dump.
    :param reason: why it failed or stopped, as the dump recorded it (or `no such dump`).
    :param chunks: chunks completed.
    :param rows: rows dumped.
    :param windows_retried: windows that timed out and were read again.
    """

    dump_id: str
    outcome: str
    state: DumpState | None
    reason: str
    chunks: int = 0
    rows: int = 0
    windows_retried: int = 0

    @classmethod
    def of(cls, dump_id: str, status: DumpStatus | None, outcome: str | None = None) -> DumpOutcome:
        """The dump whose status is `status` (None: no such dump); `outcome` defaults to its
        state, or `missing`."""
        if status is None:
            return cls(dump_id, outcome or MISSING, None, "no such dump")
        return cls(
            dump_id,
            outcome or status.state.value,
            status.state,
            status.reason,
            status.chunks,
            status.rows,
            status.windows_retried,
        )

    @property
    def stalled(self) -> bool:
        return self.outcome == STALLED

    def to_event(self) -> dict[str, Any]:
        """The JSON payload of a trigger event (and the dump operator's XCom)."""
        payload = asdict(self)
        payload["state"] = None if self.state is None else self.state.value
        return payload

    @classmethod
    def from_event(cls, payload: dict[str, Any]) -> DumpOutcome:
        state = payload.get("state")
        return cls(
            dump_id=payload["dump_id"],
            outcome=payload["outcome"],
            state=None if state is None else DumpState(state),
            reason=payload.get("reason") or "",
            chunks=int(payload.get("chunks", 0)),
            rows=int(payload.get("rows", 0)),
            windows_retried=int(payload.get("windows_retried", 0)),
        )


@dataclass(frozen=True)
class TailerHealthy:
    """A wait for the tailer's health ended: it beats with a lag within the limit.

    :param health: the heartbeat that was good enough.
    """

    health: TailerHealth

    def to_event(self) -> dict[str, Any]:
        """The JSON payload of a trigger event (and the health sensor's XCom):
        `{"healthy": true, "health": {"owner", "at_ms", "age_ms", "metrics"}}`."""
        return {"healthy": True, "health": self.health.to_json()}

    @classmethod
    def from_event(cls, payload: Mapping[str, Any]) -> TailerHealthy:
        health = payload["health"]
        return cls(
            TailerHealth(
                owner=health["owner"],
                at_ms=int(health["at_ms"]),
                age_ms=int(health["age_ms"]),
                metrics=dict(health["metrics"]),
            )
        )
