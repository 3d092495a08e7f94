"""The Lua scripts of the Redis stores: each check-and-change runs as one atomic step.

Loaded with ``register_script`` (EVALSHA, re-loaded on NOSCRIPT, e.g. after a Redis
restart). Times are the caller's wall-clock ``now`` (ARGV), so every replica and the
in-memory store agree on the same arithmetic; key TTLs (PX) are only garbage collection.
Numbers go back to Python as ``%.17g`` strings because Redis truncates Lua numbers to
integers.

Sliding window (``TAKE``, ``RECORD``): KEYS[1] is a sorted set, one member per admitted
amount, scored by its time, member ``"<amount>:<uid>"`` (the uid keeps equal amounts at the
same time distinct); KEYS[2] holds the running total of the set's amounts, so a call costs
O(entries that expired), not O(entries). An entry at time t counts while ``t > now -
window``. A ``take``'s entry is its member: ``RECORD`` with ``replaces`` removes it (a
reservation settled).

Spend reservations (``RESERVE_SPEND``, ``SETTLE_SPEND``): per (key, period), a sorted set
of reservation ids scored by expiry, a hash of their amounts and their running sum, beside
the spend total; expired ones are dropped on the next reservation.

Scripts with dynamic key names (``PEERS``) assume one Redis (or a Sentinel-managed
primary), not Redis Cluster.

May touch: nothing (module strings only).
"""

from __future__ import annotations

_WINDOW_FUNCTIONS = """
local function fmt(x) return string.format('%.17g', x) end

local function amount_of(member)
  return tonumber(string.match(member, '^[^:]+'))
end

-- drop entries at or before cutoff; returns the remaining total (and keeps KEYS[2] in sync)
local function trim(log, sum, cutoff, ttl_ms)
  local total = tonumber(redis.call('GET', sum))
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #old > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  if redis.call('ZCARD', log) == 0 then
    redis.call('DEL', sum)
    return 0
  end
  if total == nil then
    total = 0
    local all = redis.call('ZRANGE', log, 0, -1)
    for i = 1, #all do total = total + amount_of(all[i]) end
    redis.call('SET', sum, fmt(total), 'PX', ttl_ms)
  elseif #old > 0 then
    for i = 1, #old do total = total - amount_of(old[i]) end
    redis.call('SET', sum, fmt(total), 'KEEPTTL')
  end
  return total
end

local function add(log, sum, now, amount_arg, uid, total, ttl_ms)
  redis.call('ZADD', log, now, amount_arg .. ':' .. uid)
  redis.call('SET', sum, fmt(total), 'PX', ttl_ms)
  redis.call('PEXPIRE', log, ttl_ms)
end
"""

TAKE = _WINDOW_FUNCTIONS + """
-- KEYS: log, sum. ARGV: amount, limit, window_s, now, uid, ttl_ms
-- Returns {allowed (0|1), used, retry_after_s[, the added entry's member]}.
local log, sum = KEYS[1], KEYS[2]
local amount, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, now, ttl_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[6]
local used = trim(log, sum, now - window, ttl_ms)

local function fits(u)
  if amount > 0 then return u + amount <= limit end
  return u < limit
end

if fits(used) then
  if amount > 0 then
    used = used + amount
    add(log, sum, now, ARGV[1], ARGV[5], used, ttl_ms)
    return {1, fmt(used), '0', ARGV[1] .. ':' .. ARGV[5]}
  end
  return {1, fmt(used), '0'}
end
if amount > limit then return {0, fmt(used), fmt(window)} end
-- refused: walk the log oldest first until dropping those entries would admit amount
local left, start = used, 0
while true do
  local batch = redis.call('ZRANGE', log, start, start + 127, 'WITHSCORES')
  if #batch == 0 then return {0, fmt(used), '0'} end
  for i = 1, #batch, 2 do
    left = left - amount_of(batch[i])
    if fits(left) then
      return {0, fmt(used), fmt(math.max(0, tonumber(batch[i + 1]) + window - now))}
    end
  end
  start = start + 128
end
"""

RECORD = _WINDOW_FUNCTIONS + """
-- KEYS: log, sum. ARGV: amount, window_s, now, uid, ttl_ms, replaces (a member or '').
-- Adds unconditionally; first removes the member ``replaces`` if it is still in the window.
local log, sum = KEYS[1], KEYS[2]
local amount, now, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[5]
local used = trim(log, sum, now - tonumber(ARGV[2]), ttl_ms)
if ARGV[6] ~= '' and redis.call('ZREM', log, ARGV[6]) == 1 then
  used = used - amount_of(ARGV[6])
  if redis.call('ZCARD', log) == 0 then
    used = 0
    redis.call('DEL', sum)
  elseif amount <= 0 then
    redis.call('SET', sum, fmt(used), 'KEEPTTL')
  end
end
if amount > 0 then
  add(log, sum, now, ARGV[1], ARGV[4], used + amount, ttl_ms)
end
return 1
"""

_RESERVED_FUNCTIONS = """
local function fmt(x) return string.format('%.17g', x) end

-- drop the reservations that expired at or before now; returns the live ones' sum
local function expire(res, amt, held, now)
  local total = tonumber(redis.call('GET', held) or '0')
  local old = redis.call('ZRANGEBYSCORE', res, '-inf', now)
  for i = 1, #old do
    total = total - tonumber(redis.call('HGET', amt, old[i]) or '0')
    redis.call('HDEL', amt, old[i])
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', res, '-inf', now) end
  if redis.call('ZCARD', res) == 0 then
    redis.call('DEL', res, amt, held)
    return 0
  end
  if #old > 0 then redis.call('SET', held, fmt(total), 'KEEPTTL') end
  return total
end
"""

RESERVE_SPEND = _RESERVED_FUNCTIONS + """
-- KEYS: total, reservations (sorted set: id -> expiry), amounts (hash: id -> usd), their
-- sum. ARGV: usd, cap, now, ttl_s, id, ttl_ms. Returns 1 (reserved) or 0 (no room).
local now = tonumber(ARGV[3])
local held = expire(KEYS[2], KEYS[3], KEYS[4], now)
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
if spent + held >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[5])
redis.call('HSET', KEYS[3], ARGV[5], ARGV[1])
redis.call('SET', KEYS[4], fmt(held + tonumber(ARGV[1])), 'PX', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
return 1
"""

SETTLE_SPEND = _RESERVED_FUNCTIONS + """
-- KEYS: as RESERVE_SPEND. ARGV: usd, ttl_ms of the total, id ('' = none).
-- Drops the reservation (if still there) and adds usd to the total; returns the total.
if ARGV[3] ~= '' then
  local usd = redis.call('HGET', KEYS[3], ARGV[3])
  if usd then
    redis.call('HDEL', KEYS[3], ARGV[3])
    redis.call('ZREM', KEYS[2], ARGV[3])
    if redis.call('ZCARD', KEYS[2]) == 0 then
      redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
    else
      local held = tonumber(redis.call('GET', KEYS[4]) or '0') - tonumber(usd)
      redis.call('SET', KEYS[4], fmt(held), 'KEEPTTL')
    end
  end
end
local total = redis.call('INCRBYFLOAT', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return total
"""

ACQUIRE = """
-- KEYS[1]: holds (sorted set: member = hold id, score = expiry time).
-- ARGV: limit, now, ttl_s, hold_id, ttl_ms. Returns 1 (held) or 0 (all slots taken).
local holds, now = KEYS[1], tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', holds, '-inf', now)
if redis.call('ZCARD', holds) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', holds, now + tonumber(ARGV[3]), ARGV[4])
if redis.call('PTTL', holds) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', holds, ARGV[5])
end
return 1
"""

PEERS = """
-- KEYS[1]: registry (set of replica ids). ARGV: prefix of the shares keys, own replica id.
-- Returns a flat list {replica_id, shares_blob, ...}; drops ids whose blob has expired.
local out = {}
for _, rid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if rid ~= ARGV[2] then
    local blob = redis.call('GET', ARGV[1] .. rid)
    if blob then
      out[#out + 1] = rid
      out[#out + 1] = blob
    else
      redis.call('SREM', KEYS[1], rid)
    end
  end
end
return out
"""

REGISTER = """
-- KEYS[1]: the registration's record key, KEYS[2]: the registry (sorted set: member = key,
-- score = first_seen). ARGV: record, ttl_ms, key, now, registry ttl_ms.
-- A key whose record lapsed registers anew (a new first_seen), else first_seen is kept.
local fresh = redis.call('EXISTS', KEYS[1]) == 0
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if fresh then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
else
  redis.call('ZADD', KEYS[2], 'NX', ARGV[4], ARGV[3])
end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return 1
"""

REGISTRATIONS = """
-- KEYS[1]: registry (sorted set: member = key, score = first_seen). ARGV[1]: prefix of the
-- record keys. Returns a flat list {key, record, first_seen, pttl_ms, ...} ordered by
-- first_seen then key; drops keys whose record has lapsed.
local out = {}
local rows = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local record = redis.call('GET', ARGV[1] .. rows[i])
  if record then
    out[#out + 1] = rows[i]
    out[#out + 1] = record
    out[#out + 1] = rows[i + 1]
    out[#out + 1] = redis.call('PTTL', ARGV[1] .. rows[i])
  else
    redis.call('ZREM', KEYS[1], rows[i])
  end
end
return out
"""
