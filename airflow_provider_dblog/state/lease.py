"""A lease with fencing tokens: one holder at a time of a role of a source (its tailer, its
compaction follower), each holder handed a token larger than every token handed out before.

The lease is a hash (owner, token) that expires unless its holder renews it; a standby that
finds it gone acquires it and gets the next token. Tokens are `max(last + 1, Redis time in
ms)`, so a token handed out again after Redis lost the last INCR is still larger than every
token handed out before the crash (as long as the Redis host's clock does not step back
across the restart): a writer that checks the token refuses a stale holder.
"""

from __future__ import annotations

import redis

from airflow_provider_dblog.state.base import NOW_MS, RedisStore, reachable


class Lease(RedisStore):
    """The lease at `lease_key` and the last token handed out, at `token_key` (two keys of
    the source's, spelled in keys.py)."""

    def __init__(self, client: redis.Redis, source: str, lease_key: str, token_key: str) -> None:
        super().__init__(client, source)
        self.lease_key, self.token_key = lease_key, token_key

    # KEYS: lease, token. ARGV: owner, ttl_ms. Returns the new token, or 0 when the lease is held.
    _ACQUIRE = (
        NOW_MS
        + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local token = redis.call('INCR', KEYS[2])
if token < now then
  token = now
  redis.call('SET', KEYS[2], token)
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""
    )

    @reachable
    def acquire(self, owner: str, ttl_ms: int) -> int | None:
        """Hold the lease if nobody does: returns a fencing token larger than every token
        handed out before, or None while someone (this owner included) holds it. Use an owner
        name unique to the process (host, pid, a random suffix)."""
        token = int(self._eval(self._ACQUIRE, [self.lease_key, self.token_key], [owner, ttl_ms]))
        return token or None

    # KEYS: lease, token. ARGV: owner, token, floor. Returns the new token, 0 if not ours.
    _RAISE = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[2] then return 0 end
local token = math.max(redis.call('INCR', KEYS[2]), tonumber(ARGV[3]) + 1)
redis.call('SET', KEYS[2], string.format('%d', token))
redis.call('HSET', KEYS[1], 'token', string.format('%d', token))
return token
"""

    @reachable
    def raise_above(self, owner: str, token: int, floor: int) -> int | None:
        """Hold the lease with a new token above `floor` (a token a writer already took: see
        `Output.fence`) and above every token handed out; None if the lease is no longer
        ours. Whoever still holds the old token is fenced out by the new one."""
        args: list[str | int] = [owner, token, floor]
        return int(self._eval(self._RAISE, [self.lease_key, self.token_key], args)) or None

    # KEYS: lease. ARGV: owner, token, ttl_ms ('' = release). Returns 1 if the lease was ours.
    _RENEW_OR_RELEASE = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""

    @reachable
    def renew(self, owner: str, token: int, ttl_ms: int) -> bool:
        """Extend the lease; False if it is no longer ours (expired, or taken): stop at once."""
        return bool(self._eval(self._RENEW_OR_RELEASE, [self.lease_key], [owner, token, ttl_ms]))

    @reachable
    def release(self, owner: str, token: int) -> bool:
        """Give the lease up so a standby takes over without waiting for the TTL."""
        return bool(self._eval(self._RENEW_OR_RELEASE, [self.lease_key], [owner, token, ""]))
