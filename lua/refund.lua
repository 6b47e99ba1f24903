-- refund.lua: give one event's charge back to the window it was charged in,
-- only while that window is live, never below zero, at most once.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window hash of one (resource, identity) key (keys.go)
-- ARGV[1] -> event record field of the charge to refund: "e:" + 32 hex
-- ARGV[2] -> the request's start time, ms since the Unix epoch (the same
--            start the charge carries: it names the window)
-- ARGV[3] -> now, ms since the Unix epoch
-- ARGV[4] -> window length, ms (1000 .. 1e12)
-- ARGV[5] -> skew tolerance, ms (0 .. 1e12): see charge.lua
-- ARGV[6] -> grace, ms (1000 .. 1e12): see window.lua
--
-- Returns: {status, used, reset_at, start, amount}
--   status 1 applied    amount = the charged cost was given back
--                       (used never goes below 0)
--   status 2 duplicate  already refunded, or already netted: nothing changes
--   status 3 late       the window the request started in has closed or been
--                       replaced: nothing changes, the other fields are 0
--   status 5 pending    no charge yet: a marker is left so that the charge,
--                       when it comes, nets to zero (the window is opened at
--                       the start time if none is live, as the charge would)
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local field = arg_field(1)
if field == nil then return redis.error_reply("ERR tally: invalid event field") end
local t = arg_int(2, 0, MAX_MS)
if t == nil then return redis.error_reply("ERR tally: invalid start") end
local now = arg_int(3, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local len = arg_int(4, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
local tol = arg_int(5, 0, 1000000000000)
if tol == nil then return redis.error_reply("ERR tally: invalid skew tolerance") end
local grace = arg_int(6, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end

local state, w, at = place(t, now, len, tol, grace, field)
if state == "late" then
  return { 3, 0, 0, 0, 0 }
end
if state == "new" then
  w = create(at, len, grace, w, 0, field, "p")
  return { 5, w.u, w.r, w.s, 0 }
end

local rec = w.rec
if rec == false then
  redis.call("HSET", KEYS[1], field, "p")
  return { 5, w.u, w.r, w.s, 0 }
end
local cost, first = string.match(rec, "^c:(%d+):(%d+)$")
if cost == nil then
  return { 2, w.u, w.r, w.s, 0 }
end
cost = tonumber(cost)
local used = w.u - cost
if used < 0 then
  cost = w.u
  used = 0
end
redis.call("HSET", KEYS[1], "u", num(used), field, "r:" .. num(cost) .. ":" .. first)
return { 1, used, w.r, w.s, cost }
