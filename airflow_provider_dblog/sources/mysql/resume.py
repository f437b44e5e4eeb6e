"""Where a MySQL/MariaDB log reader resumes: the point saved with the tailer's checkpoint.

No server keeps a binlog reader's position (there is no slot), so the reader turns each
acknowledged commit into a `ResumePoint`, which the tailer saves under its fence and hands to
the next reader. A point is always a transaction's end: binlog file and offset after its last
event, and the GTID state that includes it (MariaDB: one `domain-server-seq` per domain;
MySQL with gtid_mode ON: the executed GTID set, `uuid:1-42,...`). MariaDB resumes by GTID state
(it ignores a file and offset unless told a GTID state), MySQL by GTID set where it has one (a
GTID state also holds on a replica after a failover), else by file and offset.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from pymysqlreplication.gtid import Gtid, GtidSet

from airflow_provider_dblog.sources.base import SourceError


@dataclass(frozen=True, slots=True)
class ResumePoint:
    file: str
    offset: int
    gtid_state: str | None = None
    """The GTID state after the transaction: MariaDB's (`0-1-42,1-7-3`) or MySQL's executed
    set (`uuid:1-42`); None without GTIDs."""

    def to_text(self) -> str:
        return json.dumps({"file": self.file, "offset": self.offset, "gtid": self.gtid_state})

    @classmethod
    def from_text(cls, text: str) -> ResumePoint:
        try:
            data = json.loads(text)
            file, offset, gtid = data["file"], data["offset"], data["gtid"]
        except (ValueError, TypeError, KeyError) as exc:
            raise SourceError(
                f"the saved MySQL resume point {text!r} is not one this reader wrote ({exc}); "
                "was the source's type changed? Delete the tailer checkpoint and dump again"
            ) from None
        if not (
            isinstance(file, str)
            and isinstance(offset, int)
            and (gtid is None or isinstance(gtid, str))
        ):
            raise SourceError(f"the saved MySQL resume point {text!r} is malformed")
        return cls(file, offset, gtid)


def advance_gtid_state(state: str, gtid: str) -> str:
    """MariaDB's GTID state after the transaction `gtid` (`domain-server-seq`): it replaces the
    state's entry of its domain, in domain order."""
    domains = {entry.split("-", 1)[0]: entry for entry in state.split(",") if entry}
    domain, sep, _ = gtid.partition("-")
    if not sep:
        raise SourceError(f"not a MariaDB GTID: {gtid!r}")
    domains[domain] = gtid
    return ",".join(domains[d] for d in sorted(domains, key=int))


def advance_gtid_set(gtid_set: str, gtid: str) -> str:
    """MySQL's executed GTID set after the transaction `gtid` (`uuid:n`); the server may
    spell a set over several lines."""
    merged = GtidSet("".join(gtid_set.split()))
    merged.merge_gtid(Gtid(gtid))
    return str(merged)


class Acknowledgements:
    """The resume point of every handed-over transaction not yet acknowledged, oldest first.

    `acknowledge(commit)` answers the point after the last such transaction whose commit is at
    most `commit`. An `Idle` value lies below every commit still to come, so acknowledging it
    never passes a transaction that was not handed over; a transaction handed over is only
    passed once the tailer says it is durable."""

    def __init__(self, start: ResumePoint) -> None:
        self._acknowledged = start
        self._pending: deque[tuple[int, ResumePoint]] = deque()

    @property
    def acknowledged(self) -> ResumePoint:
        return self._acknowledged

    def handed(self, commit: int, point: ResumePoint) -> None:
        if self._pending and commit <= self._pending[-1][0]:
            raise SourceError(
                f"binlog commit {commit} does not grow (last {self._pending[-1][0]}); "
                "was the binlog reset (RESET MASTER)? Dump the tables again"
            )
        self._pending.append((commit, point))

    def acknowledge(self, commit: int) -> ResumePoint:
        while self._pending and self._pending[0][0] <= commit:
            self._acknowledged = self._pending.popleft()[1]
        return self._acknowledged
