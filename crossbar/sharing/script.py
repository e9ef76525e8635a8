"""The shared slot ledger as one Redis script: each call is atomic in the store.

It keeps what :class:`~crossbar.sharing.ledger.SlotLedger` keeps, for replicas on several
machines (``shared_state``), and follows the same rules: a member's report replaces its
last; a freed slot owed elsewhere is *given*, then *offered* to the member whose waiting
head is first (band, its flow's requests in flight in every member, when it came; then
the member's name), and counted as that member's until it answers or the offer's time
runs out, when it goes to the next; a member silent for a lease, or leaving, is dropped,
and each slot it held is offered to the requests waiting for one of its host and model.
``tests/system/test_script.py`` runs the same cases on both.

Keys (``KEYS``): leases (sorted set: member → lease's end, ms), reports (hash: member →
report), offers (hash: id → offer), deadlines (sorted set: offer id → answer's end, ms),
gifts (hash: member → its last gift's number), the offers' sequence. ``ARGV``: the
operation, the channel prefix, the offers' time (ms), then the operation's own. A report
is JSON: ``{"counts": {SLOT: n}, "heads": {POOL: [band, in_flight, arrived, flow]},
"flows": {FLOW: n}}``, SLOT and POOL being compact JSON strings of the slot's host and
model and of the pool. Every change is published on ``<prefix>changed``; an offer on
``<prefix>offer:<member>`` as ``{"id": ID, "slot": SLOT}``. The store's clock is the only
one read, so replicas' clocks never decide a lease.
"""

from __future__ import annotations

STORE_CLOCK = r"""
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function decode(text)
  local ok, value = pcall(cjson.decode, text)
  if ok and type(value) == 'table' then return value end
  return nil
end
"""
"""What every script of crossbar's starts with: ``now``, the store's time in ms (the only
clock read), and ``decode``, JSON that another process wrote, or ``nil``."""

LEDGER_SCRIPT = (
    STORE_CLOCK
    + r"""
local leases, reports, offers = KEYS[1], KEYS[2], KEYS[3]
local deadlines, gifts, seq = KEYS[4], KEYS[5], KEYS[6]
local op, channel, offer_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function members()
  local all, found = redis.call('HGETALL', reports), {}
  for i = 1, #all, 2 do
    local report = decode(all[i + 1])
    if report then found[all[i]] = report end
  end
  return found
end

local function before(a, an, b, bn)
  for i = 1, 3 do
    if a[i] ~= b[i] then return a[i] < b[i] end
  end
  return an < bn
end

local offer

local function pass_on(id)
  local text = redis.call('HGET', offers, id)
  redis.call('HDEL', offers, id)
  redis.call('ZREM', deadlines, id)
  local given = text and decode(text)
  if given then
    local passed = given.passed or {}
    passed[#passed + 1] = given.to
    offer(given.slot, given.pools, passed)
  end
end

offer = function(slot, pools, passed)
  local skip, all, totals = {}, members(), {}
  for _, name in ipairs(passed) do skip[name] = true end
  for _, report in pairs(all) do
    if type(report.flows) == 'table' then
      for flow, n in pairs(report.flows) do
        if type(n) == 'number' then totals[flow] = (totals[flow] or 0) + n end
      end
    end
  end
  local best, name_of_best = nil, nil
  for name, report in pairs(all) do
    if not skip[name] and type(report.heads) == 'table' then
      for _, pool in ipairs(pools) do
        local head = report.heads[pool]
        if type(head) == 'table' and type(head[1]) == 'number' and type(head[2]) == 'number'
            and type(head[3]) == 'number' then
          local order = {head[1], math.max(head[2], totals[head[4]] or 0), head[3]}
          if best == nil or before(order, name, best, name_of_best) then
            best, name_of_best = order, name
          end
        end
      end
    end
  end
  if name_of_best == nil then return false end
  local id = tostring(redis.call('INCR', seq))
  local given = {to = name_of_best, slot = slot, pools = pools, passed = passed}
  redis.call('HSET', offers, id, cjson.encode(given))
  redis.call('ZADD', deadlines, now + offer_ms, id)
  redis.call('PUBLISH', channel .. 'offer:' .. name_of_best, cjson.encode({id = id, slot = slot}))
  return name_of_best
end

local function pools_for(slot)
  local key = decode(slot)
  local found, seen = {}, {}
  if key == nil then return found end
  for _, report in pairs(members()) do
    if type(report.heads) == 'table' then
      for pool, _ in pairs(report.heads) do
        local names = decode(pool)
        local serves = names and names[2] == key[2] and (names[3] == nil or names[3] == key[1])
        if serves and not seen[pool] then
          seen[pool] = true
          found[#found + 1] = pool
        end
      end
    end
  end
  return found
end

local function free(report)
  if type(report) ~= 'table' or type(report.counts) ~= 'table' then return end
  for slot, n in pairs(report.counts) do
    if type(n) == 'number' then
      for _ = 1, math.min(n, 1024) do offer(slot, pools_for(slot), {}) end
    end
  end
end

local function drop(name)
  local report = decode(redis.call('HGET', reports, name) or '')
  redis.call('ZREM', leases, name)
  redis.call('HDEL', reports, name)
  redis.call('HDEL', gifts, name)
  local all = redis.call('HGETALL', offers)
  for i = 1, #all, 2 do
    local given = decode(all[i + 1])
    if given == nil or given.to == name then pass_on(all[i]) end
  end
  free(report)
end

local function sweep()
  local changed = false
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
    drop(name)
    changed = true
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)) do
    pass_on(id)
    changed = true
  end
  return changed
end

local name, result = ARGV[4], 0
if op == 'report' then  -- first, so that the slots of members dropped now can go to its heads
  redis.call('ZADD', leases, now + tonumber(ARGV[5]), name)
  redis.call('HSET', reports, name, ARGV[6])
end
local changed = sweep() or op == 'report'
if op == 'beat' then
  if redis.call('ZSCORE', leases, name) then
    redis.call('ZADD', leases, now + tonumber(ARGV[5]), name)
    result = 1
  end
elseif op == 'give' then
  local slot, report = ARGV[5], decode(redis.call('HGET', reports, name) or '')
  if report then
    local counts = type(report.counts) == 'table' and report.counts or {}
    local held = counts[slot]
    if type(held) == 'number' and held > 1 then
      counts[slot] = held - 1
    else
      counts[slot] = nil
    end
    report.counts = counts
    redis.call('HSET', reports, name, cjson.encode(report))
    redis.call('HSET', gifts, name, ARGV[7])
    result = offer(slot, decode(ARGV[6]) or {}, {}) or ''
    changed = true
  end
elseif op == 'answer' then
  local id = ARGV[5]
  local given = decode(redis.call('HGET', offers, id) or '')
  if given and given.to == name then
    if ARGV[6] == '1' then
      redis.call('HDEL', offers, id)
      redis.call('ZREM', deadlines, id)
    else
      pass_on(id)
    end
    changed = true
  end
elseif op == 'leave' then
  if redis.call('ZSCORE', leases, name) then
    drop(name)
    changed = true
  end
elseif op == 'read' then
  local offered, all = {}, redis.call('HGETALL', offers)
  for i = 1, #all, 2 do
    local given = decode(all[i + 1])
    if given and type(given.to) == 'string' and type(given.slot) == 'string' then
      offered[#offered + 1] = given.to
      offered[#offered + 1] = given.slot
    end
  end
  result = {redis.call('HGETALL', reports), offered, redis.call('HGETALL', gifts)}
end
if changed then redis.call('PUBLISH', channel .. 'changed', name or '') end
return result
"""
)
"""The script (see the module's docstring)."""

OPERATIONS = ("report", "beat", "give", "answer", "leave", "read")
"""What the script does, its first argument."""
