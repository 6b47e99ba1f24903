-- charge.lua: charge one event's cost to the window live when the request
-- started, exactly once per event id.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window hash of one (resource, identity) key (keys.go)
-- ARGV[1] -> event record field: "e:" + 32 lower-case hex (digest of the id)
-- ARGV[2] -> cost, units (1 .. 1e9)
-- ARGV[3] -> the request's start time, ms since the Unix epoch
-- ARGV[4] -> now, ms since the Unix epoch
-- ARGV[5] -> window length, ms (1000 .. 1e12), used when the charge opens a window
-- ARGV[6] -> skew tolerance, ms (0 .. 1e12): a start up to this much before
--            the window's start still belongs to it (edge clocks differ, and
--            two edges race to open a window)
-- ARGV[7] -> grace, ms (1000 .. 1e12): see window.lua
--
-- Returns: {status, used, reset_at, start, amount}
--   status 1 applied    amount = cost was added; used is the window's new count
--   status 2 duplicate  the id was charged before: used is what that first
--                       charge returned, nothing changes, amount = 0
--   status 3 late       the request's window has closed or been replaced;
--                       nothing is charged, the other fields are 0
--   status 4 netted     a refund for this id arrived first: the two cancel,
--                       nothing is charged, amount = 0
-- Event records (HSET field -> value):
--   "c:<cost>:<used>"  charged    "r:<cost>:<used>"  charged, then refunded
--   "p"                refund first, charge pending    "n"  netted to zero
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local field = arg_field(1)
if field == nil then return redis.error_reply("ERR tally: invalid event field") end
local cost = arg_int(2, 1, 1000000000)
if cost == nil then return redis.error_reply("ERR tally: invalid cost") end
local t = arg_int(3, 0, MAX_MS)
if t == nil then return redis.error_reply("ERR tally: invalid start") end
local now = arg_int(4, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local len = arg_int(5, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
local tol = arg_int(6, 0, 1000000000000)
if tol == nil then return redis.error_reply("ERR tally: invalid skew tolerance") end
local grace = arg_int(7, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end

local state, w, at = place(t, now, len, tol, grace, field)
if state == "late" then
  return { 3, 0, 0, 0, 0 }
end
if state == "new" then
  w = create(at, len, grace, w, cost, field, "c:" .. num(cost) .. ":" .. num(cost))
  return { 1, w.u, w.r, w.s, cost }
end

local rec = w.rec
if rec == false then
  local used = w.u + cost
  redis.call("HSET", KEYS[1], "u", num(used), field, "c:" .. num(cost) .. ":" .. num(used))
  return { 1, used, w.r, w.s, cost }
end
if rec == "p" then
  redis.call("HSET", KEYS[1], field, "n")
  return { 4, w.u, w.r, w.s, 0 }
end
local first = tonumber(string.match(rec, "^[cr]:%d+:(%d+)$")) or w.u
return { 2, first, w.r, w.s, 0 }
