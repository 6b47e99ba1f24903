-- epoch.lua: tell whether a shard's primary is the one its windows were
-- written on, and when it is not, start a reseed: a time in which no process
-- reserves or applies on the shard while the edges re-assert what they hold
-- in its windows (reseed.lua). A primary is another one after a restart
-- (with or without its data) and after a promotion (Sentinel): its run id
-- then differs from the one the shard's epoch record names. A primary whose
-- dataset is gone has no epoch record at all.
-- Runs on: the shard primary, alone (no window.lua).
--
-- KEYS[1] -> the shard's epoch record (keys.go): "<run id>:<epoch>:<how>",
--            the primary the record was written on, the id of the epoch
--            that began then, and how it began: "h" by a reseed, "a" adopted
--            by a process that knew no earlier epoch (a new deployment)
-- KEYS[2] -> the shard's reseed marker (keys.go): "<epoch>"; it exists while
--            a reseed is in progress and expires when the reseed ends
-- KEYS[3] -> the shard's window format record (keys.go): "compact" once
--            every process of the deployment reads compact windows
--            (window.lua), "spans:<level>" (16 of [0-9a-f]) once every
--            process besides keeps sliding windows' span records true
--            (window.lua's touch_span; slide.lua trusts a record of the
--            same level only): set here when a deployment begins (4
--            below, spans), when a caller knew it and the record is gone
--            (an emptied primary; spans at a new level), and by the
--            operator's `tally windows compact` after a rolling upgrade
-- KEYS[4] -> (optional) when the shard's primary last began a reseed
--            (keys.go's RefillKey): ms since the Unix epoch by the caller's
--            clock, set to ARGV[6] when a reseed begins. A token bucket with no record
--            of what it spent is taken as emptied then (take.lua)
-- ARGV[1] -> mode: "check" (below), or "extend": a reseed in progress lasts
--            at least ARGV[4] more (a process still re-asserting)
-- ARGV[2] -> a fresh epoch id, 16 of [0-9a-f]: the new epoch's, when this
--            call begins one
-- ARGV[3] -> the epoch the caller last knew for the shard ("" for none: a
--            process that just started)
-- ARGV[4] -> ms (100 .. 600000): how long a reseed lasts at least after it
--            begins or a process joins it (check), or the least it lasts
--            from now (extend)
-- ARGV[5] -> "2" when the caller knew the shard's span records kept, "1"
--            when it knew its windows compact only, else ""
-- ARGV[6] -> now, ms since the Unix epoch (the caller's clock): with
--            KEYS[4], what a reseed that begins records there
--
-- check:
--   the record names this primary, and the caller knew its epoch (or knew
--   none): nothing to do (0); a reseed in progress is reported by pttl.
--   the record names this primary, the caller knew another epoch: it joins
--   the reseed in progress (2: the reseed then lasts at least ARGV[4] more, for
--   the caller to re-assert), or, when the epoch was adopted, begins a reseed
--   (1), or finds the reseed over (3: it re-asserts late).
--   no record, and the caller knew none: a new deployment, or a primary
--   emptied that no process that knew it has reached yet; the epoch is
--   adopted without a reseed (4).
--   otherwise (another primary's record, or none while the caller knew an
--   epoch): a reseed begins (1).
--
-- Returns: {state, epoch, pttl, compact, level}
--   state  0 same epoch, 1 began a reseed, 2 joined a reseed, 3 late, 4 adopted
--   epoch  the shard's epoch id now ("" when extend finds no reseed)
--   pttl   ms until the reseed in progress ends; 0 when none is
--   compact 1 when the shard's windows may be compact, else 0
--   level  the shard's format level when span records are kept, else ""
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local mode = ARGV[1]
if mode ~= "check" and mode ~= "extend" then return redis.error_reply("ERR tally: invalid mode") end
local fresh = ARGV[2]
if type(fresh) ~= "string" or #fresh ~= 16 or not string.match(fresh, "^[0-9a-f]+$") then
  return redis.error_reply("ERR tally: invalid epoch")
end
local known = ARGV[3]
if type(known) ~= "string" or #known > 16 or not string.match(known, "^[0-9a-f]*$") then
  return redis.error_reply("ERR tally: invalid known epoch")
end
local span = ARGV[4]
if type(span) ~= "string" or #span > 6 or not string.match(span, "^%d+$") or tonumber(span) < 100 or tonumber(span) > 600000 then
  return redis.error_reply("ERR tally: invalid span")
end
span = tonumber(span)
local knew = ARGV[5] or ""
if knew ~= "" and knew ~= "1" and knew ~= "2" then
  return redis.error_reply("ERR tally: invalid format")
end
if KEYS[4] ~= nil and (type(ARGV[6]) ~= "string" or #ARGV[6] < 1 or #ARGV[6] > 15 or string.find(ARGV[6], "%D")) then
  return redis.error_reply("ERR tally: invalid now")
end

-- compact reports whether the shard's windows may be compact, and the
-- level of its span records when they are kept, recording it when the
-- caller says it was (or, for a new deployment, will be). A record the
-- operator lowered to "compact" stays so.
local function compact(adopted)
  local v = redis.call("GET", KEYS[3])
  if v == "compact" then
    return 1, ""
  end
  local level = type(v) == "string" and string.match(v, "^spans:(%x+)$")
  if level and #level == 16 then
    return 1, level
  end
  if adopted or knew == "2" then
    redis.call("SET", KEYS[3], "spans:" .. fresh)
    return 1, fresh
  end
  if knew == "1" then
    redis.call("SET", KEYS[3], "compact")
    return 1, ""
  end
  return 0, ""
end

-- left is ms until the reseed in progress ends: 0 for none, and for a
-- marker no process sets (without an expiry, or beyond the longest
-- reseed_for), which only someone else on Redis could have written.
local function left()
  local t = redis.call("PTTL", KEYS[2])
  if t < 0 or t > 600000 then return 0 end
  return t
end

if mode == "extend" then
  local e = redis.call("GET", KEYS[2])
  if not e then return { 0, "", 0, compact(false) } end
  if left() < span then
    redis.call("PEXPIRE", KEYS[2], span)
  end
  return { 0, e, left(), compact(false) }
end

local run = string.match(redis.call("INFO", "server"), "run_id:(%x+)")
if run == nil then return redis.error_reply("ERR tally: no run_id in INFO server") end

local function begin(how)
  redis.call("SET", KEYS[1], run .. ":" .. fresh .. ":" .. how)
  if how == "a" then
    return { 4, fresh, 0, compact(true) }
  end
  redis.call("SET", KEYS[2], fresh, "PX", span)
  if KEYS[4] ~= nil then
    redis.call("SET", KEYS[4], ARGV[6])
  end
  return { 1, fresh, span, compact(false) }
end

local rec = redis.call("GET", KEYS[1])
if not rec then
  if known == "" then
    return begin("a")
  end
  return begin("h")
end
local was, epoch, how = string.match(rec, "^(%x+):(%x+):([ah])$")
if was ~= run then
  return begin("h")
end
if known == "" or known == epoch then
  return { 0, epoch, left(), compact(false) }
end
local t = left()
if t > 0 then
  -- A process joins: the reseed lasts long enough for it to re-assert.
  if t < span then
    redis.call("PEXPIRE", KEYS[2], span)
    t = span
  end
  return { 2, epoch, t, compact(false) }
end
if how == "a" then
  return begin("h")
end
return { 3, epoch, 0, compact(false) }
