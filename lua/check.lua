-- check.lua: read one key's live window.
-- Runs on: a replica (or the primary), with EVALSHA_RO; it never writes.
-- lua.go prepends compact.lua.
--
-- KEYS[1] -> the window of one (resource, identity) key (keys.go), in either
--            form (window.lua): a compact window's start is its reset less
--            its length
-- ARGV[1] -> now, ms since the Unix epoch (the caller's clock)
--
-- Returns:
--   {0}                      no live window: none stored, or its reset_at has
--                            passed (a replica keeps expired keys, and a
--                            lagging replica keeps closed windows)
--   {1, used, reset_at, start, expired}
--                            the live window; reset_at and start in ms;
--                            expired: the units of frozen shares
--                            (hold.lua) whose expiry has passed, which the
--                            next reservation short of room takes back
-- Errors: "ERR tally: invalid now" when ARGV[1] is not 0..1e14.
local now = arg_int(1, 0, MAX_MS)
if now == nil then
  return redis.error_reply("ERR tally: invalid now")
end

local v = redis.pcall("GET", KEYS[1])
if type(v) == "string" then
  local w = decode(v, 0)
  if w == nil or holder_producer(w.holder) == nil then
    return redis.error_reply("ERR tally: unreadable window")
  end
  if w.r <= now then
    return { 0 }
  end
  return { 1, w.u, w.r, w.s, 0 }
elseif not v then
  return { 0 }
end
local f = redis.call("HMGET", KEYS[1], "u", "s", "r")
local s = tonumber(f[2])
local r = tonumber(f[3])
if r == nil or s == nil or r <= now then
  return { 0 }
end
local expired = 0
local all = redis.call("HGETALL", KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == "z:" then
    local fr, ex = string.match(all[i + 1], "^(%d+):(%d+):")
    if fr ~= nil and tonumber(ex) < now then
      expired = expired + tonumber(fr)
    end
  end
end
return { 1, tonumber(f[1]) or 0, r, s, expired }
