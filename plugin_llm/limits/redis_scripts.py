"""The ``redis`` limit store's Lua scripts: each admission, settlement, lease step and breaker step.

Redis runs a script atomically, so each one is the whole decision (the local store's triggers
decide the same, :mod:`.local_sql`). Each script's keys and arguments are in the comment above
it; the usage counters saturate at ``MAX_TOTAL`` and each key expires when its window can no
longer be read. The key layout: docs/design.md, "Limits and leases".
"""

from __future__ import annotations

from plugin_llm.limits.admission_rule import LEASE_SHARE
from plugin_llm.limits.settings import MAX_TOTAL

__all__ = [
    "ADMIT_LUA",
    "LEASE_LUA",
    "SETTLE_LUA",
    "READ_LUA",
    "RESET_LUA",
    "BREAKER_ACQUIRE_LUA",
    "BREAKER_REPORT_LUA",
    "BREAKER_DELETE_LUA",
    "BREAKER_CLEAR_LUA",
    "BREAKER_READ_LUA",
]

_TTL_MINUTE = 120
_TTL_DAY = 40 * 86400
_TTL_MONTH = 400 * 86400

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
#: The rule is breaker_rule.breaker_after_failure's.
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

BREAKER_DELETE_LUA = "return redis.call('HDEL', KEYS[1], ARGV[1])"
BREAKER_CLEAR_LUA = "return redis.call('DEL', KEYS[1])"
BREAKER_READ_LUA = "return redis.call('HGETALL', KEYS[1])"
