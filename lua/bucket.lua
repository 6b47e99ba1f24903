-- bucket.lua: reserve units of a token bucket (take.lua's ARGV[19]) whose
-- periods near now are missing or compact and the one reserved in missing
-- or the holder's own, with no reseed in progress: a client's first
-- reservation, its first after a few quiet seconds — over many keys nearly
-- every reservation of a bucket — and, while one edge alone reserves in a
-- bucket, its next ones. It is take.lua's decision for those cases, with
-- ten arguments and only the record's codec prepended, and it keeps the
-- periods compact. In any other case it writes nothing and answers so, and
-- the caller sends take.lua, which decides as it always has.
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
-- One EXISTS counts the periods KEYS[1, 3, 4, 6, 7], the reseed marker
-- and the record; with none there nothing is read, else one MGET reads
-- them. With none there, no reseed to refill from (KEYS[8]), nothing spent
-- at once and a grant that refills within a second, want is granted and
-- the period opened with nothing else computed: the decision below comes
-- to the same. The decision is take.lua's when the marker is missing, every
-- period there is a compact string, and KEYS[1] is missing or the
-- holder's own compact period of this reset. The record (record.lua,
-- windows.md) is read whole: with none, what was spent and has not
-- refilled (d, in unit-ms) is limit * every less rate * (now - the time in
-- KEYS[8]) when that time is at or before now, else 0; with one, each
-- period not counted yet (its n, or its key's count while the key is
-- there) whose hold has ended is counted in d at the end of its hold, and
-- d refills at rate up to now. room is limit - ceil(d / every) less
-- KEYS[1]'s count, less the counts of the periods before and after it,
-- plus what the record says was spent at once in the three periods held;
-- when room >= need, min(want, room) are granted. A missing KEYS[1] is
-- opened compact, "<granted>:<reset s>:1:<holder>" (PXAT reset + grace + one
-- second, as take.lua's expiry of a bucket's period); the holder's own
-- grows, its expiry kept (as own.lua writes it). The record is written as
-- take.lua writes it (one SET ... PX ceil(d / rate) + 3 s + grace,
-- record.lua's save_bucket; none where none was and the bucket's units
-- refill within a second: then the period is the one write).
--
-- Returns: take.lua's reply, {granted, used, reset_at, start, opened, 0,
--          mine, -1, 1}, the last 1 saying KEYS[1] is the holder's own
--          compact period, so that the holder's next reservation may come
--          here first (TakeArgs.Own); or {-1} when the reseed marker
--          exists, a period is a hash, KEYS[1] is another holder's, the
--          record or a period is not one (record.lua, window.lua), or room
--          < need (take.lua then opens the period empty, or grants none):
--          nothing is written, and take.lua is the call to send.
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

-- One EXISTS: the record and every period near now are counted, and read
-- only when that count says one may be there. A reseed is take.lua's.
local there = redis.call("EXISTS", KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
-- open opens KEYS[1] compact, n units its holder's (PXAT reset + grace +
-- one second, as take.lua's expiry of a bucket's period).
local function open(n)
  redis.call("SET", KEYS[1], string.format("%.0f:%.0f:1:%s", n, reset / 1000, holder), "PXAT", int(reset + grace + 1000))
end
-- Nothing there (a client not seen for a few seconds: over many keys
-- nearly every reservation) and no reseed to refill from: the bucket is
-- full, nothing else is held, and when what is granted refills within a
-- second and nothing is spent at once the period is the one write (what
-- the general way below decides then, without the record's tables).
-- Otherwise fresh is the bucket with no record the general way goes on
-- from, with nothing to read.
local fresh = nil
if there == 0 then
  local d = emptied(KEYS[8], now, limit, rate, every)
  if d == 0 and spent == "" and want * every <= rate * 1000 then
    open(want)
    return { want, want, reset, reset - 1000, 1, 0, want, -1, 1 }
  end
  fresh = no_record(d, now)
end
local vs = { false, false, false, false, false, false, false }
if there > 0 then
  vs = redis.call("MGET", KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
  if vs[2] then
    return { -1 } -- a reseed: take.lua tells (window.lua's reseeding)
  end
  local strings = 0
  for i = 1, 7 do
    if vs[i] then
      strings = strings + 1
    end
  end
  if strings ~= there then
    return { -1 } -- a hash among them (a full period): take.lua reads it
  end
end
-- count_of is the units of the compact period v (MGET's answer) and
-- whether it is the one that resets at r (as take.lua's count_of: a period
-- of another reset counts nothing), or nil when v is no compact period
-- (take.lua tells what is wrong with it).
local function count_of(v, r)
  if not v then
    return 0, false
  end
  local u, rs, l = string.match(v, "^(%d+):(%d+):(%d+):[%w_.-]+")
  if u == nil or #u > 10 or #rs > 11 or #l > 9 then
    return nil
  end
  if tonumber(rs) * 1000 ~= r then
    return 0, false
  end
  return tonumber(u), true
end
-- The period reserved in: missing, or the holder's own compact one.
local mine = nil
if vs[1] then
  local u, rs, l, h, tail = string.match(vs[1], "^(%d+):(%d+):(%d+):([%w_.-]+)(.*)$")
  if u == nil or #u > 10 or #rs > 11 or #l > 9 or h ~= holder or tonumber(rs) * 1000 ~= reset or l ~= "1" then
    return { -1 } -- another holder's (take.lua expands it), or no period
  end
  local back, given = nil, nil
  if tail ~= "" and not string.find(tail, "^:%d+$") then
    back, given = string.match(tail, "^:(%d*):(%d+)$")
    if given == nil or #given > 15 then
      return { -1 }
    end
  end
  mine = { v = vs[1], u = u, back = back, given = given }
end
-- The periods held besides this one: the one before it and the one after
-- it (an edge's clock ahead); those two and three before are counted in d.
local before = count_of(vs[3], reset - 1000)
local after = count_of(vs[4], reset + 1000)
local two, two_is = count_of(vs[6], reset - 2000)
local three, three_is = count_of(vs[7], reset - 3000)
if before == nil or after == nil or two == nil or three == nil then
  return { -1 }
end
-- The record (record.lua), as take.lua reads it.
local b = fresh or bucket_of(vs[5], now, KEYS[8], limit, rate, every)
if b == nil then
  return { -1 } -- not a record: take.lua says so
end
-- The periods whose hold has ended counted in d (the record's, and those
-- two and three before this one from their keys where they are there),
-- and what the bucket holds besides this period.
local keyed = {}
if two_is then
  keyed[reset - 2000] = two
end
if three_is then
  keyed[reset - 3000] = three
end
settle(b, reset, keyed, now, rate, every)
local extra = held(b, reset, before, after, every)
local u = mine and tonumber(mine.u) or 0
local room = limit - u - extra
if room < need then
  return { -1 } -- take.lua opens the period empty, or grants none
end
local granted = math.min(want, room)
if spent == "1" then
  b.d = b.d + granted * every
  b.spent[reset] = (b.spent[reset] or 0) + granted
end
local given = granted
if mine == nil then
  open(granted)
else
  -- The holder's own period grows, compact, its expiry kept (own.lua's
  -- write).
  given = (mine.given and tonumber(mine.given) or u) + granted
  if mine.given == nil then
    redis.call("SET", KEYS[1], int(u + granted) .. string.sub(mine.v, #mine.u + 1), "KEEPTTL")
  else
    redis.call("SET", KEYS[1], string.format("%.0f:%.0f:1:%s:%s:%.0f", u + granted, reset / 1000, holder, mine.back, given),
      "KEEPTTL")
  end
end
u = u + granted
-- The record as take.lua leaves it: the periods held, less what is
-- counted in d now.
save_bucket(KEYS[5], b, reset, before, u, after, grace, rate, every)
local opened = 0
if mine == nil then
  opened = 1
end
return { granted, u + extra, reset, reset - 1000, opened, 0, given, -1, 1 }
