-- slide.lua: reserve units of a sub-window of a sliding window (take.lua's
-- ARGV[18]) when the sub-windows of its spans are all compact or missing
-- and the one reserved in is missing or its holder's own: over many keys,
-- nearly every reservation of a sliding window or a concurrency limit. It
-- is take.lua's decision for that one case, with ten arguments and
-- nothing prepended (take.lua defines its codec and checks its twenty-one
-- arguments on every call). In any other case it writes nothing and
-- answers so, and the caller sends take.lua, which decides as it always
-- has. Not for a token bucket, whose record take.lua keeps.
-- Runs on: the shard primary. Nothing is prepended.
--
-- KEYS[1] -> the sub-window reserved in (keys.go's SliceKey)
-- KEYS[2] -> the shard's reseed marker (keys.go): while it exists this
--            script reserves nothing (take.lua then tells whether a reseed
--            is in progress), because the sub-windows it counts may not be
--            re-asserted yet
-- KEYS[3 .. 1 + slices] -> the slices - 1 sub-windows before KEYS[1],
--            nearest first; KEYS[2 + slices .. 2 * slices] the slices - 1
--            after it, nearest first (take.lua's order, less its KEYS[2])
-- KEYS[2 * slices + 1] -> the window's span record (keys.go's
--            SpanRecordKey; window.lua's touch_span):
--            "<reset s>:<len s>:<slices>:<extra>:<level>", extra what the
--            other sub-windows of KEYS[1]'s spans hold at most in one span
--            (below), level the shard's format level that wrote it
-- Or, for the record alone: KEYS[1], KEYS[2] as above, KEYS[3] the span
--            record; with a level, and {-1} when the record does not hold
-- ARGV[1] -> now, ms since the Unix epoch (the edge's clock)
-- ARGV[2] -> sub-window length, ms, whole seconds (1000 .. 1e12)
-- ARGV[3] -> limit, units (1 .. 1e9): of any slices consecutive sub-windows
-- ARGV[4] -> need, units (1 .. limit)
-- ARGV[5] -> want, units (need .. limit)
-- ARGV[6] -> grace, ms (1000 .. 1e12), as take.lua's ARGV[6]
-- ARGV[7] -> holder, <producer>.<n> (take.lua's ARGV[7] of a compact form)
-- ARGV[8] -> reset of KEYS[1], ms, a whole second after now, at most
--            ARGV[2] after it
-- ARGV[9] -> slices (2 .. 60)
-- ARGV[10] -> the shard's format level, 16 of [0-9a-f] (epoch.lua: every
--            process keeps span records true), or "": no record is read or
--            written
--
-- The decision is take.lua's: the units reserved leave every span of
-- slices consecutive sub-windows that holds KEYS[1] within the limit
-- (those after it included), a sub-window counting only when it holds the
-- window its key names. A missing KEYS[1] is opened compact (SET ... PXAT
-- reset + grace + (slices - 1) * len, as take.lua's expiry of a
-- sub-window); the holder's own grows (SET ... KEEPTTL).
--
-- Given the record alone (three keys), it reads it with KEYS[1] and the
-- marker in one MGET: a record of KEYS[1]'s sub-window, length, slices and
-- the shard's level says what the others hold, and none of them is read;
-- without one it hands on. Given every key, one EXISTS counts the
-- sub-windows and the marker; when any is there, one MGET reads them and
-- the record (a hash reads as nil there, and EXISTS tells it from a
-- missing key); when none is, nothing else is read (a record can outlive
-- none of its spans' sub-windows, so there is none to keep true), nothing
-- is counted, and want is granted in KEYS[1], opened. With a
-- level the record is written for the next reservations here (SET ... PXAT reset + grace) when the
-- holder's own sub-window grows, or where the key had a record of another
-- sub-window (keep, below). The record is true while none of the others
-- changes: every script that changes one removes it (window.lua's
-- touch_span; this one too, with or without a level), and a level is
-- given only once every process of the deployment runs scripts that do.
--
-- Returns: take.lua's reply, {granted, used, reset_at, start, opened, 0,
--          mine, -1, own}, own 1 when the record holds for KEYS[1] after
--          the call (the caller may send the record alone next); or {-1}
--          when a reseed lasts, a sub-window here is a hash, KEYS[1] is
--          another holder's or another window's, there is no room in a
--          KEYS[1] that is missing, or the record alone does not hold:
--          nothing is written, and the caller sends every key, or
--          take.lua.
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local now, len, limit, need, want, grace, holder, reset, slices, level = string.match(table.concat(ARGV, " "),
  "^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ([%w_.-]+) (%d+) (%d+) ?([0-9a-f]*)$")
if now == nil or #ARGV ~= 10 then
  return redis.error_reply("ERR tally: invalid arguments")
end
now, len, limit, need, want = tonumber(now), tonumber(len), tonumber(limit), tonumber(need), tonumber(want)
grace, reset, slices = tonumber(grace), tonumber(reset), tonumber(slices)
if now > 100000000000000 then return redis.error_reply("ERR tally: invalid now") end
if len < 1000 or len > 1000000000000 or len % 1000 ~= 0 then return redis.error_reply("ERR tally: invalid window length") end
if limit < 1 or limit > 1000000000 then return redis.error_reply("ERR tally: invalid limit") end
if need < 1 or need > limit then return redis.error_reply("ERR tally: invalid need") end
if want < need or want > limit then return redis.error_reply("ERR tally: invalid want") end
if grace < 1000 or grace > 1000000000000 then return redis.error_reply("ERR tally: invalid grace") end
if reset % 1000 ~= 0 or reset <= now or reset - len > now or reset > 100000000000000 then
  return redis.error_reply("ERR tally: invalid window")
end
if slices < 2 or slices > 60 or (#KEYS ~= 2 * slices + 1 and #KEYS ~= 3) then
  return redis.error_reply("ERR tally: invalid slices")
end
if #holder < 3 or #holder > 100 or not string.find(holder, "^[%w_-][%w_.-]*%.[%w_-]+$") or string.find(holder, "..", 1, true) then
  return redis.error_reply("ERR tally: invalid holder")
end
if level ~= "" and #level ~= 16 then return redis.error_reply("ERR tally: invalid level") end
local alone = #KEYS == 3 -- the record, without the other sub-windows
if alone and level == "" then return redis.error_reply("ERR tally: invalid level") end
-- open opens KEYS[1] compact, n units its holder's (PXAT reset + grace +
-- (slices - 1) * len, as take.lua's expiry of a sub-window).
local function open(n)
  redis.call("SET", KEYS[1], string.format("%.0f:%.0f:%.0f:%s", n, reset / 1000, len / 1000, holder), "PXAT",
    string.format("%.0f", reset + grace + (slices - 1) * len))
end

local n = #KEYS - 1 -- KEYS[n + 1] is the span record
-- the record this sub-window's spans have: what it says, when it is one
local record = string.format("%.0f:%.0f:%.0f:", reset / 1000, len / 1000, slices)
-- extra: the fullest span holding KEYS[1], less KEYS[1]'s own units; v,
-- KEYS[1]'s value (nil: missing); stored, the record as it was.
local extra, v, stored = nil, nil, nil
if alone then
  local q = redis.call("MGET", KEYS[1], KEYS[2], KEYS[3])
  if q[2] then
    return { -1 } -- a reseed: take.lua tells (window.lua's reseeding)
  end
  stored = q[3]
  if stored and string.sub(stored, 1, #record) == record and string.sub(stored, -17) == ":" .. level then
    local x = string.match(stored, "^(%d+):", #record + 1)
    if x ~= nil and #x <= 15 and (q[1] or redis.call("EXISTS", KEYS[1]) == 0) then
      extra, v = tonumber(x), q[1]
    end
  end
  if extra == nil then
    return { -1 } -- no record of this sub-window: the caller sends every key
  end
else
  -- One EXISTS of every sub-window and the reseed marker. None there (a
  -- key not seen for a whole window, as most over many keys): the span
  -- holds nothing, and nothing is read. Else one MGET reads them and the
  -- record, vs[i] KEYS[i]'s, and a hash among them (a full sub-window, or
  -- a key that moved) is what MGET reads as nil and EXISTS counts.
  local there = redis.call("EXISTS", unpack(KEYS, 1, n))
  if there == 0 then
    -- The span holds nothing: all the limit is room, want is granted,
    -- and the sub-window opens compact (what the general way below
    -- decides then, without counting the span's sub-windows).
    open(want)
    return { want, want, reset, reset - len, 1, 0, want, -1, 0 }
  end
  local vs = redis.call("MGET", unpack(KEYS))
  if vs[2] then
    return { -1 } -- a reseed: take.lua tells (window.lua's reseeding)
  end
  stored = vs[n + 1]
  local strings = 0
  for i = 1, n do
    if vs[i] then
      strings = strings + 1
    end
  end
  if strings ~= there then
    return { -1 } -- a hash among them: take.lua reads it
  end
  -- us[m]: the units of the sub-window m after KEYS[1] (m < 0: before).
  local us = { [0] = 0 }
  for i = 3, n do
    local m = 2 - i
    if i > 1 + slices then
      m = i - 1 - slices
    end
    us[m] = 0
    local w = vs[i]
    if w then
      local u, r, l = string.match(w, "^(%d+):(%d+):(%d+):[%w_.-]+")
      if u == nil or #u > 10 or #r > 11 or #l > 9 then
        return { -1 } -- take.lua tells what is wrong with it
      end
      if tonumber(r) * 1000 == reset + m * len then
        us[m] = tonumber(u)
      end
    end
  end
  -- the spans end at 0 .. slices - 1, each the one before moved by one
  local sum = 0
  for m = 1 - slices, -1 do
    sum = sum + us[m]
  end
  extra = sum
  for e = 1, slices - 1 do
    sum = sum + us[e] - us[e - slices]
    if sum > extra then
      extra = sum
    end
  end
  v = vs[1]
end

-- KEYS[1]: missing, or the holder's own compact sub-window of this window.
local mine = nil
if v then
  local u, r, l, h, tail = string.match(v, "^(%d+):(%d+):(%d+):([%w_.-]+)(.*)$")
  if u == nil or #u > 10 or #r > 11 or #l > 9 then
    return { -1 } -- take.lua tells what is wrong with it
  end
  if h ~= holder or tonumber(r) * 1000 ~= reset or tonumber(l) * 1000 ~= len then
    return { -1 } -- another holder's, or another window
  end
  local given = nil
  if tail ~= "" and not string.find(tail, "^:%d+$") then
    given = string.match(tail, "^:%d*:(%d+)$")
    if given == nil or #given > 15 then
      return { -1 }
    end
  end
  mine = { v = v, u = u, given = given, tail = tail }
end
-- keep keeps the record true as KEYS[1] changes (window.lua's touch_span,
-- whatever the level: other callers may trust it), and returns the reply's
-- own: 1 when the record holds for KEYS[1] after the call. With a level it
-- writes this sub-window's record, when it says something else, as the
-- holder's own sub-window grows (grown) or where the key had a record of
-- another sub-window (a client seen before, likely to come back) — not
-- with the first take of a key that had none, which a key seen once a
-- sub-window would pay for and never read; without one it removes a
-- record of another sub-window. With a take, never without it.
local function keep(grown)
  local other = stored and string.match(stored, "^(%d+):") ~= string.format("%.0f", reset / 1000)
  if level ~= "" and (grown or other) then
    local rec = record .. string.format("%.0f", extra) .. ":" .. level
    if stored ~= rec then
      redis.call("SET", KEYS[n + 1], rec, "PXAT", string.format("%.0f", reset + grace))
    end
    return 1
  elseif other then
    redis.call("DEL", KEYS[n + 1])
  end
  return 0
end
local u = mine and tonumber(mine.u) or 0
local room = limit - u - extra
local start = reset - len
if mine == nil then
  if room < need then
    return { -1 } -- take.lua opens the sub-window empty
  end
  local granted = math.min(want, room)
  local own = keep(false)
  open(granted)
  return { granted, granted + extra, reset, start, 1, 0, granted, -1, own }
end
local given = u
if mine.given ~= nil then
  given = tonumber(mine.given)
end
local own = keep(true)
local granted = 0
if room >= need then
  granted = math.min(want, room)
  u, given = u + granted, given + granted
  if mine.given == nil then
    redis.call("SET", KEYS[1], string.format("%.0f", u) .. string.sub(mine.v, #mine.u + 1), "KEEPTTL")
  else
    local back = string.match(mine.tail, "^:(%d*):")
    redis.call("SET", KEYS[1], string.format("%.0f:%.0f:%.0f:%s:%s:%.0f", u, reset / 1000, len / 1000, holder, back, given),
      "KEEPTTL")
  end
end
return { granted, u + extra, reset, start, 0, 0, given, -1, own }
