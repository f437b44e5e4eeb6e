"""Least-privilege Redis ACL users for one source: what the tailer, a dump, the UI and the
compaction follower each need.

Each role gets the commands the state stores send (theirs and those their Lua scripts call:
Redis checks both against the caller's ACL) and no other, on the source's keys
(`dblog:{<source>}:*`) alone:

- `tailer`: reads and writes every key of the source (windows, the lease, the fencing token,
  the checkpoint), and subscribes to its channel (read-only windows' wake-ups);
- `dump` (also the Airflow connection's user: it requests dumps and follows them): reads every
  key, writes windows, watermarks, direct and read-only windows and the dumps' keys, never the
  tailer's (`tailer:*`: the lease, the token, the checkpoint) nor the compaction's; sequenced,
  direct and read-only dumps alike;
- `ui`: reads every key, writes only a dump's controls and status (pause, resume, cancel,
  throttle); it cannot open, close or fill a window;
- `compactor` (`dblog lake compact`, `--follow` included): reads every key (the prune horizon:
  the direct windows' and the tailer's checkpoint), writes only its lease, token and heartbeat
  (`compact:*`) and the list of pending direct windows (the horizon drops expired ones).

`acl_setuser(role, source, user)` spells the `ACL SETUSER` line that docs/operations.md shows
(the password stays out of it: add `>password` when you run it, or keep users in an ACL file).
"""

from __future__ import annotations

from airflow_provider_dblog.state.keys import SourceKeys

CONNECTION = ("hello", "ping", "client|setname", "info", "time")
"""Opening a connection (redis-py's HELLO and CLIENT SETNAME), the eviction check (INFO) and
the server clock."""

SCRIPTS = ("evalsha", "script|load", "script|exists")
"""Running the stores' Lua scripts: EVALSHA, and loading a script the server lacks."""

STORE_COMMANDS = (
    *("get", "set", "del", "exists", "incr"),
    *("hget", "hmget", "hgetall", "hset", "hsetnx", "hdel", "hexists", "hincrby"),
    *("rpush", "lpush", "ltrim", "llen", "lrange", "blmove"),
    *("sadd", "srem", "smembers"),
    *("pexpire", "pttl"),
    *("multi", "exec", "discard", "watch", "unwatch"),
    *("publish", "subscribe", "unsubscribe"),
)
"""What the tailer's and the dumps' stores send and their scripts call."""

UI_COMMANDS = ("get", "hget", "hgetall", "hset", "lrange", "llen", "pttl", "scan")
"""What the UI's snapshot reads (it finds windows by SCAN) and its control script writes."""

DUMP_WRITES = ("window:*", "wm:*", "dump*", "direct:*", "positional*", "verif*")
UI_WRITES = ("dump:*:controls", "dump:*:status")
COMPACTOR_WRITES = ("compact:*", "direct:pending")

ROLES = ("tailer", "dump", "ui", "compactor")


def acl_rules(role: str, source: str) -> list[str]:
    """The ACL rules of `role` for `source`, after `reset` (no command, no key, no channel)."""
    prefix = SourceKeys(source).prefix
    commands: tuple[str, ...]
    if role == "tailer":
        commands, keys = STORE_COMMANDS, [f"~{prefix}*"]
    elif role == "dump":
        commands = STORE_COMMANDS
        keys = [f"%R~{prefix}*", *(f"~{prefix}{pattern}" for pattern in DUMP_WRITES)]
    elif role == "ui":
        commands = UI_COMMANDS
        keys = [f"%R~{prefix}*", *(f"~{prefix}{pattern}" for pattern in UI_WRITES)]
    elif role == "compactor":
        commands = STORE_COMMANDS
        keys = [f"%R~{prefix}*", *(f"~{prefix}{pattern}" for pattern in COMPACTOR_WRITES)]
    else:
        raise ValueError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
    allowed = sorted({*CONNECTION, *SCRIPTS, *commands})
    channels = [f"&{prefix}*"] if role in ("tailer", "dump") else []
    return ["reset", "on", *(f"+{command}" for command in allowed), *keys, *channels]


def acl_setuser(role: str, source: str, user: str) -> str:
    """`ACL SETUSER <user> <rules>` for `role` on `source`, without a password."""
    return " ".join(["ACL", "SETUSER", user, *acl_rules(role, source)])
