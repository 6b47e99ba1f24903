-- open.lua: return the key's live window, opening one at now when none is
-- live, so that the first responses of a window already carry its final
-- reset_at on every edge.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window hash of one (resource, identity) key (keys.go)
-- ARGV[1] -> now, ms since the Unix epoch
-- ARGV[2] -> window length, ms (1000 .. 1e12)
-- ARGV[3] -> grace, ms (1000 .. 1e12): keys expire at reset_at + grace, and a
--            window opened on an empty key accepts event starts back to
--            now - grace (see window.lua)
--
-- Returns: {opened, used, reset_at, start}: opened is 1 when this call
-- created the window, 0 when it was already live. reset_at and start in ms.
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local len = arg_int(2, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
local grace = arg_int(3, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end

local w = load()
if w ~= nil and w.r > now then
  return { 0, w.u, w.r, w.s }
end
local p = now - grace
if w ~= nil then
  p = w.r
end
w = create(now, len, grace, p, 0)
return { 1, w.u, w.r, w.s }
