"""Conversations' placements kept in the shared store, as one Redis script: each call is
atomic in the store.

Keys (``KEYS``): placements (hash: conversation key → ``[host, turn, ms, member]``), their order
(sorted set: conversation key → the sequence number of its last placement), the sequence.
``ARGV``: the operation, the channel prefix, a placement's life (ms), the most kept, then
the operation's own:

- ``put`` NAME JSON: member NAME placed these (``[[key, host, turn], ...]``); one of a
  lower turn than the store's is left out. The ones kept are published on
  ``<prefix>placed`` as ``[NAME, [[key, host, turn], ...]]`` (the others take them from
  there, without a read); then placements older than their life, and the oldest beyond the
  most kept, are dropped. Answers how many were kept.
- ``since`` SEQ: the placements after sequence number SEQ (all of them when SEQ is past the
  store's: a store emptied or new), at most the most kept, oldest first. Answers
  ``[seq, now_ms, [key, value, ...]]``, ``seq`` being where the next call goes on from.

The store's clock alone times a placement, so replicas' clocks never decide its age.
"""

from __future__ import annotations

from crossbar.sharing.script import STORE_CLOCK

PLACES_SCRIPT = (
    STORE_CLOCK
    + r"""
local places, order, seq = KEYS[1], KEYS[2], KEYS[3]
local op, channel = ARGV[1], ARGV[2]
local life, most = tonumber(ARGV[3]), tonumber(ARGV[4])

local function drop(keys)
  for _, key in ipairs(keys) do
    redis.call('HDEL', places, key)
    redis.call('ZREM', order, key)
  end
end

local function sweep()
  local over = redis.call('ZCARD', order) - most
  if over > 0 then drop(redis.call('ZRANGE', order, 0, over - 1)) end
  while true do
    local oldest, stale = redis.call('ZRANGE', order, 0, 63), {}
    for _, key in ipairs(oldest) do
      local value = decode(redis.call('HGET', places, key) or '')
      if value and type(value[3]) == 'number' and value[3] > now - life then break end
      stale[#stale + 1] = key
    end
    drop(stale)
    if #stale < 64 then return end
  end
end

if op == 'put' then
  local name, placed, kept, told = ARGV[5], decode(ARGV[6]) or {}, 0, {}
  for i = 1, math.min(#placed, most) do
    local one = placed[i]
    if type(one) == 'table' and type(one[1]) == 'string' and #one[1] <= 64
        and type(one[2]) == 'string' and #one[2] <= 1024 and type(one[3]) == 'number' then
      local known = decode(redis.call('HGET', places, one[1]) or '')
      if not (known and type(known[2]) == 'number' and known[2] > one[3]) then
        redis.call('HSET', places, one[1], cjson.encode({one[2], one[3], now, name}))
        redis.call('ZADD', order, redis.call('INCR', seq), one[1])
        kept = kept + 1
        told[kept] = {one[1], one[2], one[3]}
      end
    end
  end
  sweep()
  if kept > 0 then
    redis.call('PUBLISH', channel .. 'placed', cjson.encode({name, told}))
  end
  return kept
elseif op == 'since' then
  local last = tonumber(redis.call('GET', seq) or '0')
  local from = tonumber(ARGV[5]) or 0
  if from > last then from = 0 end
  local found = redis.call('ZRANGEBYSCORE', order, '(' .. from, '+inf', 'WITHSCORES',
                           'LIMIT', 0, most)
  local flat = {}
  for i = 1, #found, 2 do
    flat[#flat + 1] = found[i]
    flat[#flat + 1] = redis.call('HGET', places, found[i]) or ''
  end
  if #found >= 2 * most then last = tonumber(found[#found]) end
  return {tostring(last), tostring(now), flat}
end
return redis.error_reply('unknown operation')
"""
)
"""The script (see the module's docstring)."""
