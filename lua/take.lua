-- take.lua: reserve units of a key's live window for one edge, opening the
-- window at now when none is live. The edge then admits requests against
-- what it reserved (its credit) without calling Redis again. A reservation
-- never takes a window past its limit, so whatever the edges admit from
-- credit stays within it.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window hash of one (resource, identity) key (keys.go)
-- KEYS[2] -> the calling edge's producer hash on this shard (keys.go); read
--            only: its field "s" is the edge's applied event sequence
--            (apply.lua), so that the edge can tell which of its own events
--            the returned count already holds
-- ARGV[1] -> now, ms since the Unix epoch (the edge's clock, read once for
--            the decision)
-- ARGV[2] -> window length, ms (1000 .. 1e12)
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
--            learns from its next call what it was given
--
-- Returns: {granted, used, reset_at, start, opened, applied, mine}
--   granted   units reserved: 0, or from need to want (as much as is left)
--   used      the window's units after the call, every reservation included
--   reset_at, start  the window, ms; both 0 when need is 0 and none is live
--   opened    1 when this call opened the window, else 0
--   applied   the producer's applied sequence, 0 when it has none
--   mine      every unit reserved for the holder in this window so far, this
--             call's included (0 when no window is live)
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local len = arg_int(2, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
local limit = arg_int(3, 1, MAX_UNITS)
if limit == nil then return redis.error_reply("ERR tally: invalid limit") end
local need = arg_int(4, 0, limit)
if need == nil then return redis.error_reply("ERR tally: invalid need") end
local want = arg_int(5, need, limit)
if want == nil or (need == 0 and want ~= 0) then return redis.error_reply("ERR tally: invalid want") end
local grace = arg_int(6, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end
local holder = ARGV[7]
if type(holder) ~= "string" or #holder < 1 or #holder > 100 or not string.match(holder, "^[%w_.-]+$") then
  return redis.error_reply("ERR tally: invalid holder")
end
local mine_field = "g:" .. holder

local applied = tonumber(redis.call("HGET", KEYS[2], "s")) or 0
local w = load(KEYS[1])
local opened = 0
if w == nil or w.r <= now then
  if need == 0 then
    return { 0, 0, 0, 0, 0, applied, 0 }
  end
  local p = now - grace
  if w ~= nil then
    p = w.r
  end
  w = fresh(now, len, p)
  opened = 1
end
if need == 0 then
  return { 0, w.u, w.r, w.s, 0, applied, tonumber(redis.call("HGET", KEYS[1], mine_field)) or 0 }
end
local granted = 0
local room = limit - w.u
if room >= need then
  granted = math.min(want, room)
  w.u = w.u + granted
end
if granted > 0 or opened == 1 then
  save(KEYS[1], w, grace)
end
local mine = 0
if granted > 0 then
  mine = redis.call("HINCRBY", KEYS[1], mine_field, granted)
else
  mine = tonumber(redis.call("HGET", KEYS[1], mine_field)) or 0
end
return { granted, w.u, w.r, w.s, opened, applied, mine }
