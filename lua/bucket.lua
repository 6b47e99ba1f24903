-- bucket.lua: reserve units of a token bucket (take.lua's ARGV[19]) none
-- of whose periods near now is in Redis and no reseed is in progress: a
-- client's first reservation, or its first after a few quiet seconds — over
-- many keys nearly every reservation of a bucket. It is take.lua's
-- decision for that case, with ten arguments and only the record's codec
-- prepended, and it opens the period compact. In any other case it writes
-- nothing and answers so, and the caller sends take.lua, which decides as
-- it always has.
-- Runs on: the shard primary. lua.go prepends record.lua.
--
-- KEYS[1] -> the period reserved in (keys.go's SliceKey): a sub-window of
--            one second of a span of two
-- KEYS[2] -> the shard's reseed marker (keys.go)
-- KEYS[3] -> the period before KEYS[1]; KEYS[4] the period after it
-- KEYS[5] -> the bucket's record (keys.go's BucketKey)
-- KEYS[6], KEYS[7] -> the periods two and three before KEYS[1]
-- KEYS[8] -> when the shard's primary last began a reseed (keys.go's
--            RefillKey): a bucket with no record is taken as emptied then
--            (take.lua's order of keys, less its KEYS[2])
-- ARGV[1] -> now, ms since the Unix epoch (the edge's clock)
-- ARGV[2] -> limit, units (1 .. 1e9): the burst
-- ARGV[3] -> need, units (1 .. limit)
-- ARGV[4] -> want, units (need .. limit)
-- ARGV[5] -> grace, ms (1000 .. 1e12), as take.lua's ARGV[6]
-- ARGV[6] -> holder, <producer>.<n> (take.lua's ARGV[7] of a compact form)
-- ARGV[7] -> reset of KEYS[1], ms, a whole second after now, at most one
--            second after it
-- ARGV[8] -> rate, units (1 .. 1e9) refilled every ARGV[9] ms
-- ARGV[9] -> every, ms, whole seconds (1000 .. 3600000); limit * every at
--            most 1e15
-- ARGV[10] -> "1" when the caller spends what it is granted at once
--            (take.lua's ARGV[21]), else ""
--
-- When none of the periods KEYS[1, 3, 4, 6, 7] and no reseed marker
-- exists (one EXISTS counts them and the record, which is read only when
-- that count says it may be there), the decision is take.lua's with every
-- one of those periods empty. The record (record.lua, windows.md) is read
-- whole: with
-- none, what was spent and has not refilled (d, in unit-ms) is limit *
-- every less rate * (now - the time in KEYS[8]) when that time is at or
-- before now, else 0; with one, each period it names not counted yet
-- (its n) whose hold has ended is counted in d at the end of its
-- hold, and d refills at rate up to now. room is limit - ceil(d / every)
-- less what the record says was spent at once in the three periods held;
-- when room >= need, min(want, room) are granted. One SET opens KEYS[1]
-- compact, "<granted>:<reset s>:1:<holder>" (PXAT reset + grace + one
-- second, as take.lua's expiry of a bucket's period), and the record is
-- written as take.lua writes it (one SET ... PX ceil(d / rate) + 3 s +
-- grace, record.lua's save_bucket; none where none was and the bucket's
-- units refill within a second: then the period is the one write).
--
-- Returns: take.lua's reply, {granted, used, reset_at, start, 1, 0,
--          granted, -1, 0}; or {-1} when a period or the reseed marker
--          exists, the record is not one (record.lua), or room < need
--          (take.lua then opens the period empty): nothing is written, and
--          take.lua is the call to send.
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
if #ARGV ~= 10 or #KEYS ~= 8 then
  return redis.error_reply("ERR tally: invalid arguments")
end
local now, limit, need, want, grace, holder, reset, rate, every, spent = string.match(table.concat(ARGV, " "),
  "^(%d+) (%d+) (%d+) (%d+) (%d+) ([%w_.-]+) (%d+) (%d+) (%d+) ?(1?)$")
if now == nil then
  return redis.error_reply("ERR tally: invalid arguments")
end
now, limit, need, want, grace = tonumber(now), tonumber(limit), tonumber(need), tonumber(want), tonumber(grace)
reset, rate, every = tonumber(reset), tonumber(rate), tonumber(every)
if now > 100000000000000 then return redis.error_reply("ERR tally: invalid now") end
if limit < 1 or limit > 1000000000 then return redis.error_reply("ERR tally: invalid limit") end
if need < 1 or need > limit then return redis.error_reply("ERR tally: invalid need") end
if want < need or want > limit then return redis.error_reply("ERR tally: invalid want") end
if grace < 1000 or grace > 1000000000000 then return redis.error_reply("ERR tally: invalid grace") end
if reset % 1000 ~= 0 or reset <= now or reset - 1000 > now then
  return redis.error_reply("ERR tally: invalid window")
end
if rate < 1 or rate > 1000000000 or every < 1000 or every > 3600000 or every % 1000 ~= 0 or limit * every > 1000000000000000 then
  return redis.error_reply("ERR tally: invalid bucket")
end
if #holder < 3 or #holder > 100 or not string.find(holder, "^[%w_-][%w_.-]*%.[%w_-]+$") or string.find(holder, "..", 1, true) then
  return redis.error_reply("ERR tally: invalid holder")
end

-- One EXISTS: a period near now, or a reseed, is take.lua's; the record
-- is counted too, and read only when it may be there.
local there = redis.call("EXISTS", KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
if there > 1 then
  return { -1 }
end
-- The record (record.lua), as take.lua reads it.
local v = false
if there == 1 then
  v = redis.pcall("GET", KEYS[5])
  if not v then
    return { -1 } -- what is there is a period or the marker
  end
end
local b = bucket_of(v, now, KEYS[8], limit, rate, every)
if b == nil then
  return { -1 } -- not a record: take.lua says so
end
local d, t, f, pend, x = b.d, b.t, b.f, b.pend, b.spent
-- The periods whose hold has ended, oldest first (those two and three
-- before this one are not in Redis: the record's count of them stands).
local order = {}
for r in pairs(pend) do
  if r <= reset - 2000 and r > f then
    table.insert(order, r)
  end
end
table.sort(order)
for _, r in ipairs(order) do
  if r + 1000 > t then
    d = math.max(0, d - rate * (r + 1000 - t))
    t = r + 1000
  end
  d = math.min(1000000000 * every, math.max(0, d + (pend[r] - (x[r] or 0)) * every))
  f = r
end
if now > t then
  d = math.max(0, d - rate * (now - t))
  t = now
end
local extra = math.ceil(d / every) - (x[reset - 1000] or 0) - (x[reset + 1000] or 0) - (x[reset] or 0)
local room = limit - extra
if room < need then
  return { -1 }
end
local granted = math.min(want, room)
if spent == "1" then
  d = d + granted * every
  x[reset] = (x[reset] or 0) + granted
end
redis.call("SET", KEYS[1], string.format("%.0f:%.0f:1:%s", granted, reset / 1000, holder), "PXAT", int(reset + grace + 1000))
-- The record as take.lua leaves it: the periods held, less what is
-- counted in d now.
b.d, b.t, b.f = d, t, f
pend[reset] = granted
save_bucket(KEYS[5], b, math.ceil(d / rate) + 3000 + grace, rate, every)
return { granted, granted + extra, reset, reset - 1000, 1, 0, granted, -1, 0 }
