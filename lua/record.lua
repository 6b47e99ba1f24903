-- record.lua: a token bucket's record (keys.go's BucketKey), read and
-- written by take.lua and bucket.lua (lua.go prepends it to both), what a
-- bucket with none is taken as (the shard's refill time, keys.go's
-- RefillKey), and the bucket's arithmetic both decide by; never run on
-- its own.
--
-- The record is one string, so that writing it is one SET with its expiry
-- and one effect to replicate:
--   "<d>:<t>:<f>" and, for each period after f that holds units, in order
--   of reset, " <r>:<n>:<x>"
-- d  what was spent and has not refilled yet at time t, unit-ms (units
--    times the bucket's every)
-- t  ms since the Unix epoch
-- f  the reset of the last period counted in d (0 for none)
-- r  a period's reset, ms; n its units when last seen (counted in d at the
--    end of its hold, when its key may be gone); x its units spent at once
--    (counted in d already, and not again with n)
-- Every number is a decimal integer of at most 16 digits. A record holds
-- the periods a reservation has not counted yet: those near now, and those
-- an edge whose clock runs ahead reserved in; 64 KB (over a thousand
-- periods) is read, anything longer is not a record.

-- int renders an integer-valued number without an exponent.
local function int(v)
  return string.format("%.0f", v)
end

-- emptied is d of a bucket with no record at now: what a reseed's
-- emptying of it (at the time at refill_key, when at or before now: a
-- record lost with the primary's data) has not refilled at rate every ms
-- since, else 0.
local function emptied(refill_key, now, limit, rate, every)
  local at = tonumber(redis.call("GET", refill_key) or "")
  if at ~= nil and at <= now then
    return math.max(0, limit * every - rate * (now - at))
  end
  return 0
end

-- no_record is a bucket with no record at now, d what it has spent and
-- not refilled (emptied's): bucket_of's form, had false.
local function no_record(d, now)
  return { d = d, t = now, f = 0, pend = {}, spent = {}, had = false }
end

-- bucket_of returns the record held in v (GET's answer) as
-- {d, t, f, pend = {[r] = n}, spent = {[r] = x}, had}, or nil when v is
-- not one. With no record (v false), no_record's with emptied's d.
local function bucket_of(v, now, refill_key, limit, rate, every)
  if v == false then
    return no_record(emptied(refill_key, now, limit, rate, every), now)
  end
  local b = { d = 0, t = now, f = 0, pend = {}, spent = {}, had = true }
  if type(v) ~= "string" or #v > 65536 then
    return nil
  end
  local d, t, f, rest = string.match(v, "^(%d+):(%d+):(%d+)(.*)$")
  if d == nil or #d > 16 or #t > 16 or #f > 16 then
    return nil
  end
  b.d, b.t, b.f = tonumber(d), tonumber(t), tonumber(f)
  local seen = 0
  for r, n, x in string.gmatch(rest, " (%d+):(%d+):(%d+)") do
    if #r > 16 or #n > 16 or #x > 16 then
      return nil
    end
    seen = seen + #r + #n + #x + 3
    r = tonumber(r)
    b.pend[r], b.spent[r] = tonumber(n), tonumber(x)
  end
  if seen ~= #rest then
    return nil -- anything besides the periods
  end
  return b
end

-- settle counts in b.d, oldest first and each at the end of its hold (the
-- end of the period after it), every period not counted yet (after b.f)
-- whose hold has ended before the period that resets at r0 — those of the
-- record, or, where keyed holds it, its count as its key holds it now —
-- less what was spent of it at once (counted already), refilling d at
-- rate between; then it refills d up to now. At most a billion units are
-- overdrawn: every number stays exact.
local function settle(b, r0, keyed, now, rate, every)
  local due, order = {}, {}
  for r, n in pairs(b.pend) do
    if r <= r0 - 2000 and r > b.f then
      due[r] = n
    end
  end
  for r, n in pairs(keyed) do
    if r > b.f then
      due[r] = n
    end
  end
  for r in pairs(due) do
    table.insert(order, r)
  end
  table.sort(order)
  for _, r in ipairs(order) do
    if r + 1000 > b.t then
      b.d = math.max(0, b.d - rate * (r + 1000 - b.t))
      b.t = r + 1000
    end
    b.d = math.min(1000000000 * every, math.max(0, b.d + (due[r] - (b.spent[r] or 0)) * every))
    b.f = r
  end
  if now > b.t then
    b.d = math.max(0, b.d - rate * (now - b.t))
    b.t = now
  end
end

-- held is what b holds besides the count of the period that resets at r0:
-- the periods before and after it (their counts, before and after), less
-- what the three periods' callers spent at once (in d already), and what
-- was spent and has not refilled, in units rounded up.
local function held(b, r0, before, after, every)
  local x = b.spent
  return before - (x[r0 - 1000] or 0) + after - (x[r0 + 1000] or 0) - (x[r0] or 0) + math.ceil(b.d / every)
end

-- save_bucket writes b as the record at key, with the counts of the periods
-- before, at and after r0 as a reservation leaves them, until what it
-- counts has refilled (and the periods' three seconds and grace ms): the
-- periods after b.f that hold units, and nothing of those counted. A
-- bucket that had none
-- (b.had false) writes
-- none while it would count nothing but periods each of whose units
-- refill within a second of its hold's end (n * every <= rate * 1000, and
-- nothing spent at once or left to refill): a reservation reads a period
-- until three seconds after its reset, from its key (which lives at least
-- a second past its hold's end), and its units have refilled before then
-- — so a record would tell nothing a later reservation needs. Over many
-- keys each seen now and then, a bucket of a fast rate is then one write.
local function save_bucket(key, b, r0, before, u, after, grace, rate, every)
  b.pend[r0 - 1000], b.pend[r0], b.pend[r0 + 1000] = before, u, after
  local ttl = math.ceil(b.d / rate) + 3000 + grace
  local rs, quiet = {}, not b.had and b.d == 0
  for r, n in pairs(b.pend) do
    if r > b.f and (n ~= 0 or (b.spent[r] or 0) ~= 0) then
      table.insert(rs, r)
      quiet = quiet and n * every <= rate * 1000
    end
  end
  for r, x in pairs(b.spent) do
    if r > b.f and x ~= 0 then
      quiet = false
      if b.pend[r] == nil then
        table.insert(rs, r)
      end
    end
  end
  if quiet then
    return
  end
  table.sort(rs)
  local parts = { int(b.d) .. ":" .. int(b.t) .. ":" .. int(b.f) }
  for _, r in ipairs(rs) do
    table.insert(parts, int(r) .. ":" .. int(b.pend[r] or 0) .. ":" .. int(b.spent[r] or 0))
  end
  redis.call("SET", key, table.concat(parts, " "), "PX", int(ttl))
end
