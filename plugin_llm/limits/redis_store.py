"""The ``redis`` limit store: several gateway hosts sharing one Redis.

Each admission, settlement and lease step is one Lua script run by the server (atomic), sent as
``EVALSHA`` with a fallback to ``EVAL``: one round trip; a settlement queued with ``settle_later``
rides along in the next admission's round trip. A plugin's keys share one hash tag (one cluster
slot); their layout is in docs/design.md, "Limits and leases".

Every socket operation is bounded by the time the caller gives (the call's remaining deadline,
capped by ``limits.store_timeout``); redis-py's own retries are off, so a Redis that is down or
stalled fails fast into ``on_store_error``. ``now`` comes from the caller: hosts sharing a Redis
need synchronised clocks (NTP); a skew only shifts window edges. redis-py is imported when this
store is first used, never at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from typing import Any

from plugin_llm.limits.settings import MAX_TOTAL, PluginLimits, plugin_phrase, redact_url, url_secrets
from plugin_llm.limits.store import (
    MAX_BREAKER_ROUTES,
    MAX_PROBE_SECONDS,
    Admission,
    BreakerState,
    breaker_row,
    breaker_state,
    check_route,
    Counters,
    LEASE_SHARE,
    Denial,
    LeaseGrant,
    LeaseOp,
    LimitStore,
    Reservation,
    SettlementQueue,
    StoreDataError,
    StoreError,
    buckets_at,
    deny,
    new_reservation_id,
)

__all__ = ["RedisStore", "ADMIT_LUA", "SETTLE_LUA", "LEASE_LUA", "BREAKER_ACQUIRE_LUA", "BREAKER_REPORT_LUA"]

_log = logging.getLogger("plugin_llm.limits")

_TTL_MINUTE = 120
_TTL_DAY = 40 * 86400
_TTL_MONTH = 400 * 86400
_MAX_IDLE = 64  # idle connections kept for reuse

#: KEYS: res, resv, minute, day, month
#: ARGV: now, expires, id, cost, tokens, minute, day, month, then the caps in LIMIT_NAMES order (-1 = none)
_PARSE_LUA = """
local function parse(v)
  -- "cost tokens minute day month" (one call) or "... slots requests" (a lease)
  local c, t, mi, d, mo, rest = string.match(v, '^(%d+) (%d+) (%S+) (%S+) (%S+)(.*)$')
  if not c then return nil end
  local s, r = 1, 1
  if rest ~= '' then
    local s2, r2 = string.match(rest, '^ (%d+) (%d+)$')
    if not s2 then return nil end
    s, r = tonumber(s2), tonumber(r2)
  end
  return tonumber(c), tonumber(t), mi, d, mo, s, r
end
"""

ADMIT_LUA = _PARSE_LUA + """
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  for i = 1, #expired, 500 do  -- unpack() has a stack limit: delete in slices
    redis.call('HDEL', KEYS[2], unpack(expired, i, math.min(i + 499, #expired)))
  end
end
local live = redis.call('HVALS', KEYS[2])
local slots_held, req_held, tok_held, day_held, month_held = 0, 0, 0, 0, 0
for i = 1, #live do
  local c, t, mi, d, mo, s, r = parse(live[i])
  if c then
    slots_held = slots_held + s
    if mi == ARGV[6] then req_held = req_held + r; tok_held = tok_held + t end
    if d == ARGV[7] then day_held = day_held + c end
    if mo == ARGV[8] then month_held = month_held + c end
  end
end
local earliest = '-1'
if #live > 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then earliest = first[2] end
end
local minute = redis.call('HMGET', KEYS[3], 'r', 't')
local req = tonumber(minute[1] or '0')
local tok = tonumber(minute[2] or '0')
local day = tonumber(redis.call('GET', KEYS[4]) or '0')
local month = tonumber(redis.call('GET', KEYS[5]) or '0')
local cost, tokens = tonumber(ARGV[4]), tonumber(ARGV[5])
local used = {0, req, tok, day, month}
local held = {slots_held, req_held, tok_held, day_held, month_held}
local ask = {1, 1, tokens, cost, cost}
for i = 1, 5 do
  local cap = tonumber(ARGV[8 + i])
  if cap >= 0 and used[i] + held[i] + ask[i] > cap then
    return {0, i, used[i], held[i], earliest}
  end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7] .. ' ' .. ARGV[8])
return {1}
""".replace("@TTL_MINUTE@", str(_TTL_MINUTE))
#: KEYS: res, resv, minute, day, month (of the lease's buckets), the lease's settled total
#: ARGV: now, expires, id, minute, day, month, what the lease has settled in all, its steps so far and this one
#: (LeaseOp.applied + settled: requests/tokens/nano, 7-9; the script adds what the store lacks), keep (10-13), ask (14-17),
#: want (18-21) in DIMS order, the caps in LIMIT_NAMES order (22-26, -1 = none), keep_expires (27).
#: Returns {1, slots, requests, tokens, nano, expires} or {0, limit, used, held, earliest}.
LEASE_LUA = _PARSE_LUA + """
local now, id = tonumber(ARGV[1]), ARGV[3]
-- what this lease's steps settled so far, as this store counted them (a key of its own, which outlives the
-- lease's row: another process may purge that row once it expires): a step that timed out after it ran
-- here is sent again, and only what is not counted yet is added
local ar, at, an = 0, 0, 0
local counted = redis.call('GET', KEYS[6])
if counted then
  local r2, t2, n2 = string.match(counted, '^(%d+) (%d+) (%d+)$')
  if r2 then ar, at, an = tonumber(r2), tonumber(t2), tonumber(n2) end
end
local treq, ttok, tnano = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])  -- (<= MAX_TOTAL: exact)
local sreq, stok, snano = math.max(0, treq - ar), math.max(0, ttok - at), math.max(0, tnano - an)
if treq + ttok + tnano > 0 then  -- kept (each step) until the lease, and a retry of its last step, cannot come back
  local ttl = math.ceil(math.max(tonumber(ARGV[2]), tonumber(ARGV[27])) - now) + @TTL_MINUTE@
  redis.call('SET', KEYS[6], string.format('%d %d %d', math.max(treq, ar), math.max(ttok, at), math.max(tnano, an)),
             'EX', math.max(@TTL_MINUTE@, ttl))
end
if snano > 0 then
  local add = string.format('%d', snano)
  if redis.call('INCRBY', KEYS[4], add) > @MAX@ then redis.call('SET', KEYS[4], '@MAX@') end
  redis.call('EXPIRE', KEYS[4], @TTL_DAY@)
  if redis.call('INCRBY', KEYS[5], add) > @MAX@ then redis.call('SET', KEYS[5], '@MAX@') end
  redis.call('EXPIRE', KEYS[5], @TTL_MONTH@)
end
if sreq > 0 and redis.call('HINCRBY', KEYS[3], 'r', string.format('%d', sreq)) > @MAX@ then
  redis.call('HSET', KEYS[3], 'r', '@MAX@')
end
if stok > 0 and redis.call('HINCRBY', KEYS[3], 't', string.format('%d', stok)) > @MAX@ then
  redis.call('HSET', KEYS[3], 't', '@MAX@')
end
if sreq > 0 or stok > 0 then redis.call('EXPIRE', KEYS[3], @TTL_MINUTE@) end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  for i = 1, #expired, 500 do
    redis.call('HDEL', KEYS[2], unpack(expired, i, math.min(i + 499, #expired)))
  end
end
local live = redis.call('HGETALL', KEYS[2])
local held = {0, 0, 0, 0, 0}
for i = 1, #live, 2 do
  if live[i] ~= id then
    local c, t, mi, d, mo, s, r = parse(live[i + 1])
    if c then
      held[1] = held[1] + s
      if mi == ARGV[4] then held[2] = held[2] + r; held[3] = held[3] + t end
      if d == ARGV[5] then held[4] = held[4] + c end
      if mo == ARGV[6] then held[5] = held[5] + c end
    end
  end
end
local minute = redis.call('HMGET', KEYS[3], 'r', 't')
local used = {0, tonumber(minute[1] or '0'), tonumber(minute[2] or '0'),
              tonumber(redis.call('GET', KEYS[4]) or '0'), tonumber(redis.call('GET', KEYS[5]) or '0')}
local keep = {tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])}
local ask = {tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])}
local want = {tonumber(ARGV[18]), tonumber(ARGV[19]), tonumber(ARGV[20]), tonumber(ARGV[21])}
local caps = {tonumber(ARGV[22]), tonumber(ARGV[23]), tonumber(ARGV[24]), tonumber(ARGV[25]), tonumber(ARGV[26])}
local dim = {1, 2, 3, 4, 4}  -- limit -> lease dimension (the day and the month budgets share nano)
local function store(h, expires)
  if h[1] + h[2] + h[3] + h[4] == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
  else
    redis.call('ZADD', KEYS[1], expires, id)
    redis.call('HSET', KEYS[2], id, string.format('%d %d %s %s %s %d %d', h[4], h[3], ARGV[4], ARGV[5], ARGV[6], h[1], h[2]))
  end
end
if ask[1] > 0 then
  for i = 1, 5 do
    local d = dim[i]
    if caps[i] >= 0 and used[i] + held[i] + keep[d] + ask[d] > caps[i] then
      store(keep, ARGV[27])
      local earliest = '-1'
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      if first[2] then earliest = first[2] end
      return {0, i, used[i], held[i] + keep[d], earliest}
    end
  end
end
local free = {}
for i = 1, 5 do
  if caps[i] >= 0 then
    local d = dim[i]
    local f = caps[i] - used[i] - held[i] - keep[d] - ask[d]
    if free[d] == nil or f < free[d] then free[d] = f end
  end
end
local h = {}
for d = 1, 4 do
  local extra = 0
  if free[d] ~= nil then extra = math.max(0, math.min(want[d], math.floor(free[d] / @SHARE@))) end
  h[d] = keep[d] + ask[d] + extra
end
store(h, ARGV[2])
return {1, h[1], h[2], h[3], h[4]}
""".replace("@TTL_DAY@", str(_TTL_DAY)).replace("@TTL_MONTH@", str(_TTL_MONTH)).replace(
    "@TTL_MINUTE@", str(_TTL_MINUTE)).replace("@SHARE@", str(LEASE_SHARE)).replace("@MAX@", str(MAX_TOTAL))

#: KEYS: res, resv, minute, day, month; ARGV: id, cost, tokens[, 1: a retry, applied only while the reservation is there]
SETTLE_LUA = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 and ARGV[4] == '1' then
  return 0  -- sent again after a reply that never came: the reservation is gone, so it was applied (or expired)
end
redis.call('HDEL', KEYS[2], ARGV[1])
local cost, tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
if cost > 0 then  -- the usage counters saturate at MAX_TOTAL (never near INCRBY's overflow)
  if redis.call('INCRBY', KEYS[4], ARGV[2]) > @MAX@ then redis.call('SET', KEYS[4], '@MAX@') end
  redis.call('EXPIRE', KEYS[4], @TTL_DAY@)
  if redis.call('INCRBY', KEYS[5], ARGV[2]) > @MAX@ then redis.call('SET', KEYS[5], '@MAX@') end
  redis.call('EXPIRE', KEYS[5], @TTL_MONTH@)
end
redis.call('HINCRBY', KEYS[3], 'r', 1)
if tokens > 0 and redis.call('HINCRBY', KEYS[3], 't', ARGV[3]) > @MAX@ then redis.call('HSET', KEYS[3], 't', '@MAX@') end
redis.call('EXPIRE', KEYS[3], @TTL_MINUTE@)
return 1
""".replace("@TTL_DAY@", str(_TTL_DAY)).replace("@TTL_MONTH@", str(_TTL_MONTH)).replace(
    "@TTL_MINUTE@", str(_TTL_MINUTE)).replace("@MAX@", str(MAX_TOTAL))

#: KEYS: res, resv, minute, day, month; ARGV: now -> the counters, read-only
READ_LUA = _PARSE_LUA + """
local now = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES')
local earliest = '-1'
if #ids > 0 then earliest = ids[2] end
local n, req_held, tok_held, day_held, month_held = 0, 0, 0, 0, 0
for i = 1, #ids, 2 do
  local v = redis.call('HGET', KEYS[2], ids[i])
  if v then
    local c, t, mi, d, mo, s, r = parse(v)
    if c then
      n = n + s
      if mi == ARGV[2] then req_held = req_held + r; tok_held = tok_held + t end
      if d == ARGV[3] then day_held = day_held + c end
      if mo == ARGV[4] then month_held = month_held + c end
    end
  end
end
local minute = redis.call('HMGET', KEYS[3], 'r', 't')
return {n, earliest, tok_held, day_held, month_held, req_held,
        minute[1] or '0', minute[2] or '0', redis.call('GET', KEYS[4]) or '0', redis.call('GET', KEYS[5]) or '0'}
"""


#: forget the settled usage of the current minute, day and month; returns what it held (as strings:
#: exact integers, whatever their size)
RESET_LUA = """
local minute = redis.call('HMGET', KEYS[1], 'r', 't')
local out = {minute[1] or '0', minute[2] or '0', redis.call('GET', KEYS[2]) or '0', redis.call('GET', KEYS[3]) or '0'}
for i = 1, 4 do
  if not string.match(out[i], '^%d+$') then return {'corrupt', i} end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return out
"""


# The routes' circuit breakers: one hash, <prefix>:breakers, route -> "state failures first_failure
# opened_at retry_at updated" ('-' for none). The numbers are the caller's (``now`` and what it adds),
# written back as sent, so a row reads back exactly as the local store's does.
_BREAKER_PARSE_LUA = """
local function row(v)
  if not v then return nil end
  local st, n, first, opened, retry = string.match(v, '^(%S+) (%d+) (%S+) (%S+) (%S+) %S+$')
  if st == 'closed' and (first == '-' or tonumber(first)) then return st, tonumber(n), first, opened, retry end
  if (st == 'open' or st == 'half_open') and tonumber(opened) and tonumber(retry) then
    return st, tonumber(n), first, opened, retry
  end
  return nil  -- not a row this store writes (edited): the route counts as closed
end
"""

#: KEYS: the breakers hash; ARGV: route, now, the end of a probe's lease -> closed | open | probe
BREAKER_ACQUIRE_LUA = _BREAKER_PARSE_LUA + """
local st, n, first, opened, retry = row(redis.call('HGET', KEYS[1], ARGV[1]))
if st == nil or st == 'closed' then return 'closed' end
if tonumber(ARGV[2]) < tonumber(retry) then return 'open' end
redis.call('HSET', KEYS[1], ARGV[1], string.format('half_open %d %s %s %s %s', n, first, opened, ARGV[3], ARGV[2]))
return 'probe'
"""

#: KEYS: the breakers hash; ARGV: route, now, failures that open it, window, now + cooldown, the most
#: routes kept -> the new state. A success is not sent here (it deletes the route's field).
#: The rule is store.breaker_after_failure's.
BREAKER_REPORT_LUA = _BREAKER_PARSE_LUA + """
local route, now = ARGV[1], tonumber(ARGV[2])
local found = redis.call('HGET', KEYS[1], route)
local st, n, first, opened, retry = row(found)
local cap = @CAP@
local out
if st == 'open' then
  out = {'open', math.min(n + 1, cap), first, opened, retry}
elseif st == 'half_open' then
  out = {'open', math.min(n + 1, cap), first, ARGV[2], ARGV[5]}
else
  local count, start = 1, ARGV[2]
  if st == 'closed' and n > 0 and tonumber(first) and now - tonumber(first) <= tonumber(ARGV[4]) then
    count, start = math.min(n + 1, cap), first
  end
  if count >= tonumber(ARGV[3]) then
    out = {'open', count, start, ARGV[2], ARGV[5]}
  else
    out = {'closed', count, start, '-', '-'}
  end
end
if not found and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[6]) then
  -- a new route in a full hash: the oldest closed breaker goes (else the oldest open one)
  local all = redis.call('HGETALL', KEYS[1])
  local victim, vclosed, vtime = nil, false, 0
  for i = 1, #all, 2 do
    local s = string.match(all[i + 1], '^(%S+)')
    local t = tonumber(string.match(all[i + 1], '(%S+)$')) or -1
    local closed = s ~= 'open' and s ~= 'half_open'
    if victim == nil or (closed and not vclosed) or (closed == vclosed and t < vtime) then
      victim, vclosed, vtime = all[i], closed, t
    end
  end
  if victim then redis.call('HDEL', KEYS[1], victim) end
end
redis.call('HSET', KEYS[1], route, string.format('%s %d %s %s %s %s', out[1], out[2], out[3], out[4], out[5], ARGV[2]))
return out[1]
""".replace("@CAP@", "1000000000")

_BREAKER_DELETE_LUA = "return redis.call('HDEL', KEYS[1], ARGV[1])"
_BREAKER_CLEAR_LUA = "return redis.call('DEL', KEYS[1])"
_BREAKER_READ_LUA = "return redis.call('HGETALL', KEYS[1])"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _breaker_from(value: Any):
    """A hash value -> a checked row, or None (not one this store writes)."""
    parts = _text(value).split(" ")
    if len(parts) != 6 or not parts[1].isdigit() or len(parts[1]) > 12:
        return None
    numbers = []
    for part in parts[2:5]:
        try:
            numbers.append(None if part == "-" else float(part))
        except ValueError:
            return None
    return breaker_row(parts[0], int(parts[1]), *numbers)


_COUNT = re.compile(rb"\d{1,19}")  # a settled count as Redis holds it (INCRBY keeps it below 2**63)
_PLAIN_ID = re.compile(r"^[A-Za-z0-9_.\-/@+:]{1,128}$")


def _key_id(plugin_id: str) -> str:
    """The plugin id inside a key: verbatim when plain, else a digest (a brace or a newline in an id
    must not be able to reach into another plugin's keys)."""
    if _PLAIN_ID.match(plugin_id):
        return plugin_id
    return "sha256-" + hashlib.sha256(plugin_id.encode("utf-8", "surrogatepass")).hexdigest()


def _bulk(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _pack_head(command: str, script: str, nkeys: int, nargs: int) -> bytes:
    return b"*%d\r\n" % (3 + nkeys + nargs) + _bulk(command) + _bulk(script) + _bulk(nkeys)


def _pack_tail(keys: list[str], args: list[Any]) -> bytes:
    """RESP encoding of the keys and arguments (redis-py's generic packer costs more than the round trip)."""
    return b"".join([_bulk(k) for k in keys] + [_bulk(a) for a in args])


def _reason(exc: BaseException, secrets: tuple[str, ...]) -> str:
    text = str(exc) or type(exc).__name__
    for secret in secrets:
        text = text.replace(secret, "***")
    return text if len(text) <= 200 else text[:197] + "..."


class RedisStore(LimitStore):
    """Redis store at ``url``; keys under ``prefix``. Connections are reused across threads (a small idle list); a forked child opens its own."""

    name = "redis"
    supports_leases = True

    def __init__(self, url: str, *, prefix: str = "plugin_llm", timeout: float = 2.0) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:  # pragma: no cover - redis is a dependency
            raise StoreError("limits.store is redis but the redis package is not installed: pip install 'redis>=5'") from None
        self._redis = redis
        self._display = redact_url(url)
        self._secret = url_secrets(url)
        try:
            self._pool = redis.ConnectionPool.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0,
            )
            self._pool.make_connection()  # (not connected yet) the URL's options are the connection's
        except (TypeError, ValueError, redis.RedisError) as exc:  # an option redis-py does not take, say
            raise StoreError(f"limits.redis_url ({self._display}) is not usable: {_reason(exc, self._secret)}; "
                             "fix it in config.yaml") from None
        self.prefix = prefix
        self._sha: dict[str, str] = {}
        self._queue = SettlementQueue(self._apply_queued, "redis", timeout)
        self._idle: list[Any] = []  # connections not in use, most recently used last
        self._idle_lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"RedisStore({self._display!r})"

    # -- one round trip, bounded by the caller's time
    def _take(self):
        """An idle connection, or a new one (opened with the URL's settings on first use)."""
        pid = os.getpid()
        with self._idle_lock:
            if self._pid != pid:  # forked: the parent's sockets are not ours (redis-py never shuts them here)
                self._idle, self._pid = [], pid
            if self._idle:
                return self._idle.pop()
        return self._pool.connection_class(**self._pool.connection_kwargs)

    def _give_back(self, conn) -> None:
        with self._idle_lock:
            if self._pid == os.getpid() and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.disconnect()

    def _send_and_read(self, conn, commands: list[tuple[str, list[str], list[Any]]], *, source_always: bool = False) -> list:
        """Send every script in one write and read every reply: one round trip. An error reply is
        returned as its exception (the connection stays in step)."""
        redis = self._redis
        packed = []
        for source, keys, args in commands:
            sha = None if source_always else self._sha.get(source)
            head = (_pack_head("EVALSHA", sha, len(keys), len(args)) if sha is not None
                    else _pack_head("EVAL", source, len(keys), len(args)))
            packed.append(head + _pack_tail(keys, args))
        conn.send_packed_command([b"".join(packed)], check_health=False)
        replies: list[Any] = []
        for source, _, _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
                continue
            if source not in self._sha:
                self._sha[source] = hashlib.sha1(source.encode()).hexdigest()
        return replies

    def _run_scripts(self, commands: list[tuple[str, list[str], list[Any]]], timeout: float) -> list:
        """Run ``commands`` (source, keys, args) in one round trip (two if the server lost its script cache)."""
        redis = self._redis
        t = max(0.001, timeout)
        conn = None
        sent = False
        try:
            conn = self._take()
            conn.socket_timeout = conn.socket_connect_timeout = t
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                sock.settimeout(t)
            if sock is None:
                conn.connect()  # connect first, so that a refused connection is known to have sent nothing
            sent = True
            replies = self._send_and_read(conn, commands)
            lost = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
            if lost:  # the server restarted or flushed its script cache: send those sources again
                for i, reply in zip(lost, self._send_and_read(conn, [commands[i] for i in lost], source_always=True)):
                    replies[i] = reply
            self._give_back(conn)
            return replies
        except (redis.RedisError, OSError, AttributeError, IndexError, TypeError, ValueError) as exc:
            if conn is not None:
                conn.disconnect()
            if isinstance(exc, (redis.RedisError, OSError)):
                error = StoreError(f"the Redis limits store ({self._display}) failed: {_reason(exc, self._secret)}")
            else:  # what redis-py raises when the server does not speak Redis
                error = StoreError(f"the Redis limits store ({self._display}) does not answer as a Redis server "
                                   f"does ({type(exc).__name__}): is limits.redis_url a Redis server?")
            error.maybe_applied = sent
            raise error from None
        except BaseException:
            if conn is not None:
                conn.disconnect()  # a half-read reply must not be read by the next call
            raise

    def _script(self, source: str, keys: list[str], args: list[Any], timeout: float):
        (reply,) = self._run_scripts([(source, keys, args)], timeout)
        if isinstance(reply, Exception):
            raise StoreError(f"the Redis limits store ({self._display}) refused the script: {_reason(reply, self._secret)}")
        return reply

    def _with_queued(self, script: str, plugin_id: str, b: Any, args: list[Any], timeout: float,
                     more_keys: tuple[str, ...] = ()) -> Any:
        """Run ``script`` for the plugin's buckets (and ``more_keys``) in one round trip, after the queued
        settlements (they ride along, in order, before it); its reply, or StoreError when Redis refused it."""
        queued = self._queue.take()
        keys = [*self._keys(plugin_id, b.minute, b.day, b.month), *more_keys]
        try:
            replies = self._run_scripts([*queued, (script, keys, args)], timeout)
        except StoreError as exc:
            if queued:
                self._lost(queued, exc)
            raise
        self._settled(replies, len(queued))
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise StoreError(f"the Redis limits store ({self._display}) refused the script: {_reason(reply, self._secret)}")
        return reply

    def _settled(self, replies: list, count: int) -> None:
        for reply in replies[:count]:
            if isinstance(reply, Exception):
                _log.error("limits: the Redis limits store (%s) refused a settlement: %s", self._display,
                           _reason(reply, self._secret))

    def _lost(self, items: list, exc: StoreError) -> None:
        """Settlements a failed round trip may not have applied go back to the queue. Those that were
        sent (applied or not, nobody knows) are sent again as retries, which Redis applies only while
        the reservation is still there: at most once (once it expired, as a reservation it counted)."""
        if getattr(exc, "maybe_applied", True):
            items = [(source, keys, [*args[:3], 1]) if source is SETTLE_LUA else (source, keys, args)
                     for source, keys, args in items]
        self._queue.put_back(items)

    @contextlib.contextmanager
    def _parsing(self, what: str):
        """A reply that is not what the script returns (not a Redis, a proxy, a tampered script) is a store error."""
        try:
            yield
        except (IndexError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise StoreError(f"the Redis limits store ({self._display}) answered {what} with something that is "
                             f"not a limits reply ({type(exc).__name__}): is limits.redis_url a Redis server?") from None

    def _not_counts(self, plugin_id: str, more: str) -> StoreDataError:
        return StoreDataError(f"the Redis limits store ({self._display}) holds a count that is not a whole number of 0 "
                              f"or more for {plugin_phrase(plugin_id)} (edited?){more}; fix or delete its keys "
                              f"({self.prefix}:{{{_key_id(plugin_id)}}}:*): a reset does not erase what it cannot read "
                              "and record")

    def _prefix(self, plugin_id: str) -> str:
        return f"{self.prefix}:{{{_key_id(plugin_id)}}}"  # one hash tag: every key of a plugin in one slot

    def _keys(self, plugin_id: str, minute: str, day: str, month: str) -> list[str]:
        p = self._prefix(plugin_id)
        return [f"{p}:res", f"{p}:resv", f"{p}:mi:{minute}", f"{p}:d:{day}", f"{p}:mo:{month}"]

    def admit(self, plugin_id: str, reservation: Reservation, limits: PluginLimits, now: float, *,
              timeout: float) -> Admission | Denial:
        b = buckets_at(now)
        rid = new_reservation_id()
        expires = now + max(0.0, reservation.ttl)
        caps = (limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute,
                limits.budget_day_nano, limits.budget_month_nano)
        args = [repr(now), repr(expires), rid, int(reservation.cost_nano), int(reservation.tokens), b.minute, b.day, b.month,
                *(-1 if c is None else int(c) for c in caps)]
        reply = self._with_queued(ADMIT_LUA, plugin_id, b, args, timeout)
        with self._parsing("an admission"):
            if int(reply[0]) == 1:
                return Admission(plugin_id, rid, reservation.cost_nano, reservation.tokens, b, expires)
            earliest = float(reply[4])
            return deny(plugin_id, limits, int(reply[1]) - 1, int(reply[2]), int(reply[3]), reservation, b,
                        earliest if earliest >= 0 else None)

    def lease(self, plugin_id: str, op: LeaseOp, limits: PluginLimits, *, timeout: float) -> LeaseGrant | Denial:
        b = op.buckets
        caps = (limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute,
                limits.budget_day_nano, limits.budget_month_nano)
        total = (min(MAX_TOTAL, a + s) for a, s in zip(op.applied, op.settled))
        args = [repr(op.now), repr(op.expires), op.lease_id, b.minute, b.day, b.month, *total, *op.keep, *op.ask,
                *op.want, *(-1 if c is None else int(c) for c in caps), repr(op.keep_expires)]
        counted = f"{self._prefix(plugin_id)}:lt:{op.lease_id}"  # what the lease settled in all, as counted here
        reply = self._with_queued(LEASE_LUA, plugin_id, b, args, timeout, (counted,))
        with self._parsing("a lease step"):
            if int(reply[0]) == 1:
                held = (int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]))
                return LeaseGrant(held, op.expires if any(held) else op.keep_expires)
            earliest = float(reply[4])
            r = Reservation(cost_nano=op.ask[3], tokens=op.ask[2], ttl=0.0)
            return deny(plugin_id, limits, int(reply[1]) - 1, int(reply[2]), int(reply[3]), r, b,
                        earliest if earliest >= 0 else None)

    def _settle_command(self, admission: Admission, cost_nano: int, tokens: int) -> tuple[str, list[str], list[Any]]:
        a, b = admission, admission.buckets
        return (SETTLE_LUA, self._keys(a.plugin_id, b.minute, b.day, b.month),
                [a.reservation_id, max(0, int(cost_nano)), max(0, int(tokens))])

    def settle(self, admission: Admission, cost_nano: int, tokens: int, *, timeout: float) -> None:
        self._script(*self._settle_command(admission, cost_nano, tokens), timeout)

    def settle_later(self, admission: Admission, cost_nano: int, tokens: int) -> None:
        self._queue.add(self._settle_command(admission, cost_nano, tokens))

    def _apply_queued(self, items: list, timeout: float) -> None:
        try:
            replies = self._run_scripts(items, timeout)
        except StoreError as exc:
            self._lost(items, exc)
            raise
        self._settled(replies, len(items))

    def flush(self, *, timeout: float) -> None:
        self._queue.flush(timeout)

    def counters(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        self.return_leases(plugin_id, timeout=timeout)
        self._queue.flush(timeout)
        b = buckets_at(now)
        r = self._script(READ_LUA, self._keys(plugin_id, b.minute, b.day, b.month), [repr(now), b.minute, b.day, b.month], timeout)
        with self._parsing("a read"):
            earliest = float(r[1])
            if not all(_COUNT.fullmatch(v if isinstance(v, bytes) else str(v).encode()) for v in r[6:10]) \
                    or min(int(v) for v in r[:1] + r[2:6]) < 0:  # (the settled counts come as Redis holds them)
                raise self._not_counts(plugin_id, "")
            return Counters(
                in_flight=int(r[0]), earliest_expiry=earliest if earliest >= 0 else None,
                minute_tokens_reserved=int(r[2]), day_reserved=int(r[3]), month_reserved=int(r[4]),
                minute_requests_reserved=int(r[5]), minute_requests=int(r[6]), minute_tokens=int(r[7]),
                day_spent=int(r[8]), month_spent=int(r[9]),
            )

    def reset(self, plugin_id: str, now: float, *, timeout: float) -> Counters:
        self.return_leases(plugin_id, timeout=timeout)
        self._queue.flush(timeout)
        b = buckets_at(now)
        keys = self._keys(plugin_id, b.minute, b.day, b.month)[2:]
        r = self._script(RESET_LUA, keys, [], timeout)  # what is deleted is what is read: one script
        if r and r[0] in (b"corrupt", "corrupt"):  # checked before anything was deleted
            raise self._not_counts(plugin_id, "; nothing was deleted")
        with self._parsing("a reset"):
            counts = [int(v) for v in r]
            if len(counts) != 4 or min(counts) < 0:
                raise ValueError("not four counts of 0 or more")
            return Counters(minute_requests=counts[0], minute_tokens=counts[1], day_spent=counts[2],
                            month_spent=counts[3])

    # -- circuit breakers: one hash for every route, each step one script
    def _breakers_key(self) -> str:
        return f"{self.prefix}:breakers"

    def _state_reply(self, reply: Any, what: str) -> str:
        state = _text(reply)
        if state not in ("closed", "open", "half_open", "probe"):
            with self._parsing(what):
                raise ValueError(state[:40])
        return state

    def breaker_acquire(self, route: str, policy, now: float, *, timeout: float, probe_for: float) -> str:
        check_route(route)
        if policy.failures <= 0:
            return "closed"
        probe_until = now + max(0.0, min(float(probe_for), MAX_PROBE_SECONDS))
        reply = self._script(BREAKER_ACQUIRE_LUA, [self._breakers_key()], [route, repr(float(now)), repr(probe_until)],
                             timeout)
        return self._state_reply(reply, "a breaker step")

    def breaker_report(self, route: str, ok: bool, policy, now: float, *, timeout: float) -> str:
        check_route(route)
        if policy.failures <= 0:
            return "closed"
        if ok:
            self._script(_BREAKER_DELETE_LUA, [self._breakers_key()], [route], timeout)
            return "closed"
        now = float(now)
        args = [route, repr(now), int(policy.failures), repr(float(policy.window)), repr(now + policy.cooldown),
                MAX_BREAKER_ROUTES]
        return self._state_reply(self._script(BREAKER_REPORT_LUA, [self._breakers_key()], args, timeout),
                                 "a breaker report")

    def breaker_states(self, now: float, *, timeout: float) -> dict[str, BreakerState]:
        reply = self._script(_BREAKER_READ_LUA, [self._breakers_key()], [], timeout)
        out: dict[str, BreakerState] = {}
        with self._parsing("a breaker read"):
            for field, value in zip(reply[::2], reply[1::2]):
                route, row = _text(field), _breaker_from(value)
                if row is not None:  # (an edited value counts as closed: not listed)
                    out[route] = breaker_state(route, row)
        return dict(sorted(out.items()))

    def breaker_reset(self, route: str | None, *, timeout: float) -> None:
        if route is None:
            self._script(_BREAKER_CLEAR_LUA, [self._breakers_key()], [], timeout)
        else:
            self._script(_BREAKER_DELETE_LUA, [self._breakers_key()], [check_route(route)], timeout)

    def close(self) -> None:
        try:
            self.close_leases(timeout=2.0)
        except StoreError:
            pass  # the leases expire by themselves
        try:
            self._queue.flush()
        except StoreError:
            pass  # logged by _lost
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.disconnect()
            except Exception:  # closing is best effort
                pass
