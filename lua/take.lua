-- take.lua: reserve units of a key's live window for one edge, opening the
-- window the caller names (ARGV[16], ARGV[17]; without them, at the whole
-- second of now) when none is live. The edge then admits
-- requests against what it reserved (its credit) without calling Redis again.
-- A reservation never takes a window past its limit, so whatever the edges
-- admit from credit stays within it.
-- Runs on: the shard primary. lua.go prepends compact.lua, and puts
-- window.lua where the line "-- (window.lua)" is below: the cold path runs
-- before the rest of the model is defined.
--
-- KEYS[1] -> the window of one (resource, identity) key (keys.go), in
--            either form (window.lua)
-- KEYS[2] -> the calling edge's producer hash on this shard (keys.go); read
--            only, and only when the edge owes something (ARGV[9]): what of
--            the edge's events apply.lua applied, so that the edge can tell
--            which of its own events the returned count already holds
-- KEYS[3] -> the shard's reseed marker (keys.go): while it lasts, nothing is
--            reserved (window.lua's reseeding), but in compact windows of
--            the holder's own (below)
-- ARGV[1] -> now, ms since the Unix epoch (the edge's clock, read once for
--            the decision)
-- ARGV[2] -> window length, ms (1000 .. 1e12): of the window a take opens
--            (ARGV[17] - ARGV[16] when those are given)
-- ARGV[3] -> limit, units (1 .. 1e9)
-- ARGV[4] -> need, units (0 .. limit): reserve nothing unless at least this
--            much is left. 0 (with want 0) only reads: it opens nothing and
--            writes nothing
-- ARGV[5] -> want, units (need .. limit): the most to reserve
-- ARGV[6] -> grace, ms (1000 .. 1e12): keys expire at reset_at + grace, and a
--            first window accepts event starts back to now - grace
-- ARGV[7] -> holder, 1 to 100 of [A-Za-z0-9_.-]: who the units are reserved
--            for (an edge's table entry). The window counts, in its field
--            "g:<holder>", every unit ever reserved for the holder in it, so
--            that a holder whose answer was lost (a timeout while the
--            primary was frozen, after which Redis ran the script anyway)
--            learns from its next call what it was given. It is the
--            producer, or begins with the producer and a dot
-- ARGV[8] -> producer, the calling edge's producer id (keys.go's
--            ValidProducer): what is reserved is added to the window's
--            c:<producer>, what the edge may give back later
-- ARGV[9] -> owed: the edge's charges of this window sent as accounting
--            events (mode async) that may not be applied yet, as
--            "<seq>:<units>" pairs separated by commas (at most 64; "" for
--            none). Those whose seq is beyond applied (below) count as used:
--            a reservation never takes room the edge has already admitted
--            requests into
-- ARGV[10] -> moving to: "" (none), or, when the caller asks the key's
--            previous shard while shards are added or removed, the name of
--            the shard that owns the key now (1 to 32 of [a-z0-9_-]). A
--            live window here is served here until it resets; with none,
--            the key is marked moved (field "m": the new owner's name, for
--            the window's length plus grace) and the call fails MOVED
--            below, as every later call here fails while the mark lasts:
--            from then on the key's windows open on the new owner only
--
-- ARGV[11] -> keep: "" (freeze nothing), or the units of what this call
--            reserves the caller leaves free; the rest is added to its
--            frozen share (hold.lua's "z:<holder>") when the window holds
--            exactly ARGV[12] for it, until ARGV[13] (ms)
-- ARGV[12] -> share: the holder's frozen share as the caller last saw it
-- ARGV[13] -> share expiry, ms
-- ARGV[14] -> "1" when the shard's windows may be compact (epoch.lua's
--            format: every process of the deployment reads them), else ""
-- ARGV[15] -> "1" when the policy's windows are aligned to the clock: a
--            window opened here starts at the multiple of its length since
--            the Unix epoch that now falls in (window.lua's opening), else ""
-- ARGV[16] -> start, ms, a whole second, at or before now; with ARGV[17]
--            reset, ms, a whole second, after now and ARGV[2] after start:
--            the window a take opens when none is live, as the caller's
--            policy places it (limiter.Policy.WindowAt: a window of the
--            calendar lasts its period, 23 to 25 hours for a day, 28 to 31
--            days for a month). Both "" (or absent, an older caller): the
--            window opens where ARGV[2] and ARGV[15] say (compact.lua's
--            opening). A live window is never moved: its stored reset holds
--            until it passes, whatever a take names
--
-- ARGV[18] -> slices: "" (or absent): a window. 2 .. 60: the window is one
--            sub-window of a sliding window of that many sub-windows of
--            ARGV[2], aligned (ARGV[15] "1"), the one ARGV[16] and ARGV[17]
--            name; KEYS[4 .. 2 + slices] are the slices - 1 sub-windows
--            before it, nearest first, and KEYS[3 + slices .. 1 + 2 *
--            slices] the slices - 1 after it, nearest first (keys.go's
--            SliceKey: each under its own key, named by its reset). A
--            reservation leaves every span of slices consecutive
--            sub-windows that holds this one within the limit, those after
--            it included (an edge whose clock runs behind reserves in a
--            sub-window another has moved past), and "used" in the reply is
--            the fullest of those spans. A sub-window counts in the spans
--            of the slices - 1 after it, so its key expires at reset_at +
--            grace + (slices - 1) * ARGV[2]. This script opens a
--            sub-window full; slide.lua opens it compact and is sent
--            first while every sub-window of its spans is compact or
--            missing, and either form is read here (a compact one is
--            expanded before this script changes it). While
--            the key moves (ARGV[10]), a sub-window opens on this shard
--            when any sub-window of its spans here holds units, and the
--            key is marked moved only when none does.
--
-- Compact windows (window.lua): with ARGV[14] "1", a take that owes
-- nothing, moves nothing and freezes nothing, in a window of whole
-- seconds, for a holder <producer>.<n>, opens a window compact (one SET
-- ... PXAT reset + grace) and keeps it compact while that holder alone
-- reserves in it (one SET ... KEEPTTL). Those two writes touch nothing
-- another holder has: they do not read the reseed marker (a process that
-- knows of a reseed sends no take, redisstore's gate; docs/operations.md,
-- "When a primary changes"). A take by another holder, or one the compact
-- form cannot hold, expands the window first. An edge opens the window of
-- a key it knows nothing of with a plain SET ... NX, without this script
-- (redisstore's batch.go); this script runs when a key was there.
--
-- A reservation that finds too little room first takes back the frozen
-- shares (hold.lua's "z:<holder>" fields) whose expiry has passed: the
-- credit of edges that stopped reporting, which they will not spend. It
-- leaves "t:<holder>" behind, so that a reseed does not make the share again
-- (reseed.lua).
--
-- Returns: {granted, used, reset_at, start, opened, applied, mine, frozen,
--          own}
--   granted   units reserved: 0, or from need to want (as much as is left)
--   used      the window's units after the call, every reservation included
--   reset_at, start  the window, ms; both 0 when need is 0 and none is live
--   opened    1 when this call opened the window, else 0
--   applied   the highest n such that every event 1..n of the producer has
--             been applied here (0 when none has, and when owed is ""
--             the producer's hash is not read: 0)
--   mine      every unit reserved for the holder in this window so far, this
--             call's included (0 when no window is live)
--   frozen    the holder's frozen share after the call, when keep was given
--             and the share was as the caller saw it; else -1
--   own       1 when the window is, after the call, the holder's own compact
--             one (its next reservation may be own.lua's); else 0
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
--         "TALLYMOVED <shard>": the key has moved to that shard (no live
--         window here); nothing is reserved here.
--         "TALLYRESEEDING": the shard's primary changed and its windows
--         are being re-asserted (need > 0 only; a read goes on); nothing
--         is written.
local digits = digits_only(6)
local now = arg_int(1, 0, MAX_MS, digits)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local len = arg_int(2, 1000, 1000000000000, digits)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
local limit = arg_int(3, 1, MAX_UNITS, digits)
if limit == nil then return redis.error_reply("ERR tally: invalid limit") end
local need = arg_int(4, 0, limit, digits)
if need == nil then return redis.error_reply("ERR tally: invalid need") end
local want = arg_int(5, need, limit, digits)
if want == nil or (need == 0 and want ~= 0) then return redis.error_reply("ERR tally: invalid want") end
local grace = arg_int(6, 1000, 1000000000000, digits)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end
local holder, producer = ARGV[7], ARGV[8]
-- A holder <producer>.<n> of a valid producer is a valid holder.
local compact_form = valid_producer(producer) and type(holder) == "string" and #holder <= 100
  and compact_holder(holder, producer)
if not compact_form then
  if type(holder) ~= "string" or #holder < 1 or #holder > 100 or not string.match(holder, "^[%w_.-]+$") then
    return redis.error_reply("ERR tally: invalid holder")
  end
  if not valid_producer(producer) or (holder ~= producer and string.sub(holder, 1, #producer + 1) ~= producer .. ".") then
    return redis.error_reply("ERR tally: invalid producer")
  end
end
local align = ARGV[15] == "1"
if ARGV[15] ~= nil and ARGV[15] ~= "" and not align then
  return redis.error_reply("ERR tally: invalid align")
end
-- opens: where a window this call opens starts (it resets len later).
local opens = nil
if (ARGV[16] or "") ~= "" or (ARGV[17] or "") ~= "" then
  opens = arg_int(16, 0, MAX_MS)
  local reset = arg_int(17, 0, MAX_MS)
  if opens == nil or reset == nil or opens % 1000 ~= 0 or reset % 1000 ~= 0 or opens > now or reset <= now
      or reset - opens ~= len then
    return redis.error_reply("ERR tally: invalid window")
  end
else
  opens = opening(now, len, align)
end
-- A sliding window (ARGV[18]): its sub-windows, and how long one counts
-- after its reset.
local slices = 0
local bucketKeys = 0
if (ARGV[19] or "") ~= "" then
  bucketKeys = 4
end
if (ARGV[18] or "") ~= "" then
  slices = arg_int(18, 2, 60)
  if slices == nil or (ARGV[16] or "") == "" or not align or #KEYS ~= 1 + 2 * slices + bucketKeys then
    return redis.error_reply("ERR tally: invalid slices")
  end
end
-- A token bucket (ARGV[19], ARGV[20]): how fast it refills.
local rate, every = nil, nil
if bucketKeys > 0 then
  rate = arg_int(19, 1, MAX_UNITS)
  every = arg_int(20, 1000, 3600000)
  if rate == nil or every == nil or every % 1000 ~= 0 or slices ~= 2 or len ~= 1000 or limit * every > 1000000000000000
      or (ARGV[21] ~= nil and ARGV[21] ~= "" and ARGV[21] ~= "1") then
    return redis.error_reply("ERR tally: invalid bucket")
  end
end
local spentNow = ARGV[21] == "1"
local linger = 0
if slices > 0 then
  linger = (slices - 1) * len
end

-- The cold path: a take the compact form can hold (the shard's windows may
-- be compact; it owes nothing, moves nothing, freezes nothing; whole
-- seconds; a holder <producer>.<n>) on a key that holds no live window or
-- the holder's own compact one. One GET and one SET; the reseed marker is
-- not read (the header above).
local simple = slices == 0 and compact_form and ARGV[14] == "1" and ARGV[9] == "" and (ARGV[10] or "") == "" and (ARGV[11] or "") == ""
  and need > 0 and len % 1000 == 0

-- open_compact opens a window at now, compact, replacing whatever the key
-- held, accepting starts back to p (nil: a first window's).
local function open_compact(p)
  local s = opens
  local r = s + len
  redis.call("SET", KEYS[1], encode(want, s, r, holder, p or first_p(s, grace), grace), "PXAT", num(r + grace))
  return { want, want, r, s, 1, 0, want, -1, 1 }
end

if simple then
  local v = redis.pcall("GET", KEYS[1])
  local w = nil
  if type(v) == "string" then
    w = decode(v, grace)
    if w == nil or (w.holder ~= holder and holder_producer(w.holder) == nil) then
      return redis.error_reply("ERR tally: unreadable window at " .. KEYS[1])
    end
  end
  if not v then
    return open_compact(nil)
  elseif w ~= nil and w.r <= now then
    return open_compact(w.r) -- the window ended: replaced whole
  elseif w ~= nil and w.holder == holder then
    -- The holder's own window: it stays compact.
    local granted = 0
    if limit - w.u >= need then
      granted = math.min(want, limit - w.u)
      if w.mine == w.u then
        redis.call("SET", KEYS[1], num(w.u + granted) .. string.sub(v, w.ulen + 1), "KEEPTTL") -- the rest as it was
      else
        redis.call("SET", KEYS[1], encode(w.u + granted, w.s, w.r, holder, w.p, grace, w.mine + granted), "KEEPTTL")
      end
      w.u, w.mine = w.u + granted, w.mine + granted
    end
    return { granted, w.u, w.r, w.s, 0, 0, w.mine, -1, 1 }
  end
  -- Another holder's window, or a full one: the general path below.
end

-- (window.lua)

local moving = ARGV[10] or ""
if #moving > 32 or not string.match(moving, "^[a-z0-9_-]*$") then
  return redis.error_reply("ERR tally: invalid moving")
end
local owedArg = ARGV[9]
if type(owedArg) ~= "string" or #owedArg > 64 * 28 or (#owedArg > 0 and (not string.match(owedArg, "^[%d:,]+$")
    or string.sub(owedArg, 1, 1) == "," or string.sub(owedArg, -1) == "," or string.find(owedArg, ",,", 1, true))) then
  return redis.error_reply("ERR tally: invalid owed")
end
local keep, share, shareExpiry = nil, 0, 0
if ARGV[11] ~= nil and ARGV[11] ~= "" then
  keep = arg_int(11, 0, MAX_UNITS)
  share = arg_int(12, 0, MAX_UNITS)
  shareExpiry = arg_int(13, 0, MAX_MS)
  if keep == nil or share == nil or shareExpiry == nil then
    return redis.error_reply("ERR tally: invalid freeze")
  end
end
local owedPairs = {}
for tok in string.gmatch(owedArg, "[^,]+") do
  local sq, un = string.match(tok, "^(%d+):(%d+)$")
  if sq == nil or #sq > 15 or #un > 10 or tonumber(sq) < 1 or tonumber(un) < 1 or tonumber(un) > MAX_UNITS or #owedPairs == 64 then
    return redis.error_reply("ERR tally: invalid owed")
  end
  table.insert(owedPairs, { tonumber(sq), tonumber(un) })
end

local mine_field, held_field = "g:" .. holder, "c:" .. producer

-- What the edge owes counts only for the events not applied yet: the
-- producer's hash is read only when the edge owes something.
local applied = 0
local owed = 0
if #owedPairs > 0 then
  applied = applied_prefix(KEYS[2])
  for _, o in ipairs(owedPairs) do
    if o[1] > applied then
      owed = owed + o[2]
    end
  end
end
-- One read: the window, and what it holds for the holder and the producer.
local w, form, f = read(KEYS[1], grace, { mine_field, held_field, "m" })
-- A sliding window: extra is the most that a span holding this sub-window
-- counts besides it (what every reservation here adds to each of them).
local extra = 0
-- count_of is the count of the sub-window stored at key when it is the one
-- that resets at r, else nil: one HMGET (sub-windows are hashes), a string
-- read as any window.
local function count_of(key, r)
  local f = redis.pcall("HMGET", key, "u", "r")
  if type(f) == "table" and f.err == nil then
    if tonumber(f[2]) == r then
      return tonumber(f[1]) or 0
    end
    return nil
  end
  local sw = load(key, grace)
  if sw ~= nil and sw.r == r then
    return sw.u
  end
  return nil
end
local us = { [0] = 0, [-1] = 0, [1] = 0 }
if slices > 0 then
  local r0 = opens + len
  -- Sub-windows after this one exist only when an edge's clock is ahead:
  -- one EXISTS says whether any is there to read.
  local after = {}
  for i = 1, slices - 1 do
    after[i] = KEYS[2 + slices + i]
  end
  local ahead = redis.call("EXISTS", unpack(after)) > 0
  for i = 1, slices - 1 do
    us[-i] = count_of(KEYS[3 + i], r0 - i * len) or 0
    us[i] = 0
    if ahead then
      us[i] = count_of(KEYS[2 + slices + i], r0 + i * len) or 0
    end
  end
  if rate == nil then
    for t = 0, slices - 1 do
      local sum = 0
      for m = t - slices + 1, t do
        sum = sum + us[m]
      end
      extra = math.max(extra, sum)
    end
  end
end
-- A token bucket: what was spent and has not refilled yet (d), once the
-- periods whose units are no longer held are counted in it, each when its
-- hold ended (the end of the period after it), and d refilled at rate.
-- Units reserved by a caller that spends them at once (ARGV[21]) are
-- counted in d when they are reserved, and in their period's x (record.lua)
-- (the period holds its count less those).
local bucket = nil
if rate ~= nil then
  local r0 = opens + len
  bucket = bucket_of(redis.pcall("GET", KEYS[6]), now, KEYS[9], limit, rate, every)
  if bucket == nil then
    return redis.error_reply("ERR tally: unreadable bucket at " .. KEYS[6])
  end
  bucket.f0 = bucket.f
  local keyed = {}
  for j = 2, 3 do
    local r = r0 - j * len
    if r > bucket.f then
      keyed[r] = count_of(KEYS[5 + j], r)
    end
  end
  settle(bucket, r0, keyed, now, rate, every)
  extra = held(bucket, r0, us[-1], us[1], every)
end
-- Every write here waits for a reseed in progress (the cold path above
-- touched only what is the holder's alone).
if need > 0 and reseeding(KEYS[3]) then
  return redis.error_reply("TALLYRESEEDING the shard's windows are being re-asserted")
end
if slices > 0 and rate == nil then
  touch_span(KEYS[1], opens + len)
end
local mine, held_now, moved = 0, 0, nil
if form == "compact" then
  if w.holder == holder then
    mine = w.mine
  end
  if w.producer == producer then
    held_now = w.held
  end
elseif form == "full" then
  mine, held_now, moved = tonumber(f[5]) or 0, tonumber(f[6]) or 0, f[7]
end
local opened = 0
if w == nil or w.r <= now or (slices > 0 and w.r ~= opens + len) then
  -- No live window (for a sub-window, none of its own reset): a key that
  -- moved opens its windows on its new owner.
  if moved then
    return redis.error_reply("TALLYMOVED " .. moved)
  end
  if moving ~= "" and extra == 0 then
    if need > 0 then
      redis.call("DEL", KEYS[1])
      redis.call("HSET", KEYS[1], "m", moving)
      redis.call("PEXPIRE", KEYS[1], len + grace)
    end
    return redis.error_reply("TALLYMOVED " .. moving)
  end
  if need == 0 then
    return { 0, 0, 0, 0, 0, applied, 0, -1, 0 }
  end
  local s = opens
  local p = first_p(s, grace)
  if w ~= nil then
    p = w.r
  end
  if simple then
    -- A full window that ended: replaced whole (SET replaces a hash),
    -- compact, in one write.
    return open_compact(p)
  end
  -- A window that ended, or a key holding part of one: replaced whole.
  if form ~= nil then
    redis.call("DEL", KEYS[1])
  end
  w = ending(s + len, len, p)
  opened, owed, mine, held_now = 1, 0, 0, 0
end
if need == 0 then
  return { 0, w.u + extra, w.r, w.s, 0, applied, mine, -1, 0 }
end
if form == "compact" then
  if limit - w.u - extra - owed < need then
    -- No room, and none to take back: a compact window holds no frozen share.
    return { 0, w.u + extra, w.r, w.s, 0, applied, mine, -1, 0 }
  end
  expand(KEYS[1], w, grace + linger)
end
local granted = 0
local room = limit - w.u - extra - owed
if room < need and opened == 0 then
  -- Short of room: the frozen shares of edges that stopped reporting
  -- (hold.lua) come back first. An edge never spends a share once it has
  -- expired unreported, so the units were never admitted.
  local all = redis.call("HGETALL", KEYS[1])
  local back = 0
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == "z:" then
      local fr, ex, pr = string.match(all[i + 1], "^(%d+):(%d+):(.+)$")
      if fr ~= nil and tonumber(ex) < now then
        fr = tonumber(fr)
        back = back + fr
        local cf = "c:" .. pr
        local c = math.max(0, (tonumber(redis.call("HGET", KEYS[1], cf)) or 0) - fr)
        redis.call("HSET", KEYS[1], cf, num(c), "t:" .. string.sub(all[i], 3), "1")
        if cf == held_field then
          held_now = c
        end
        redis.call("HDEL", KEYS[1], all[i])
      end
    end
  end
  if back > 0 then
    w.u = math.max(0, w.u - back)
    redis.call("HSET", KEYS[1], "u", num(w.u))
    room = limit - w.u - extra - owed
  end
end
if room >= need then
  granted = math.min(want, room)
  w.u = w.u + granted
  if bucket ~= nil and spentNow then
    local r0 = opens + len
    bucket.d = bucket.d + granted * every
    bucket.spent[r0] = (bucket.spent[r0] or 0) + granted
  end
end
mine, held_now = mine + granted, held_now + granted
-- One write: a new window whole, with its expiry; else the count and the
-- holder's and the producer's shares of it.
if opened == 1 then
  redis.call("HSET", KEYS[1], "u", num(w.u), "s", num(w.s), "r", num(w.r), "p", num(w.p), mine_field, num(mine),
    held_field, num(held_now))
  redis.call("PEXPIREAT", KEYS[1], num(w.r + grace + linger))
elseif granted > 0 then
  redis.call("HSET", KEYS[1], "u", num(w.u), mine_field, num(mine), held_field, num(held_now))
end
-- A bucket's record: what is counted in it now, and the periods held,
-- as this call leaves them (written when it reserved, or counted a
-- period); it lasts until what it counts has refilled. One SET
-- (record.lua's save_bucket), or none where there was none and every
-- period's units refill within a second.
if bucket ~= nil and (granted > 0 or bucket.f ~= bucket.f0) then
  save_bucket(KEYS[6], bucket, opens + len, us[-1], w.u, us[1], grace, rate, every)
end
-- What the caller will not spend yet, frozen in the same call.
local frozen = -1
if keep ~= nil and granted > 0 then
  local zf = "z:" .. holder
  local cur = redis.call("HGET", KEYS[1], zf)
  local have = 0
  if cur then
    have = tonumber(string.match(cur, "^(%d+):")) or 0
  end
  if have == share then
    frozen = have + math.max(0, granted - keep)
    if frozen > have then
      redis.call("HSET", KEYS[1], zf, num(frozen) .. ":" .. num(shareExpiry) .. ":" .. producer)
    end
  end
end
return { granted, w.u + extra, w.r, w.s, opened, applied, mine, frozen, 0 }
