"""What the state store needs of its Redis server: that it never evicts a key.

Windows, chunk rows, dump progress and the checkpoint are keys that only their owners delete. A
Redis that evicts keys under `maxmemory` would drop them silently: an evicted chunk or window
loses rows, an evicted checkpoint replays or skips the log. So a policy other than
`noeviction` with a memory limit is refused at start; without a limit nothing is evicted.
"""

from __future__ import annotations

import redis

from airflow_provider_dblog.state.base import address_of, unreachable
from airflow_provider_dblog.state.errors import StateStoreError


class EvictingRedis(StateStoreError):
    """The Redis server may evict keys: the state store refuses it."""


def check_no_eviction(client: redis.Redis) -> None:
    """Raise `EvictingRedis` if the server has a memory limit and a policy that evicts.
    Reads `INFO memory`, which managed services that forbid `CONFIG` still answer."""
    try:
        memory = client.info("memory")
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise unreachable(client, exc) from exc
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    limit = int(memory.get("maxmemory", 0) or 0)
    if limit and policy != "noeviction":
        raise EvictingRedis(
            f"the Redis state store at {address_of(client)} evicts keys (maxmemory {limit} "
            f"bytes, maxmemory-policy {policy}): an evicted window, chunk or checkpoint would "
            "lose rows silently. Set maxmemory-policy noeviction (a full Redis then refuses "
            "writes, which the tailer and dumps wait out), or remove the memory limit"
        )
