-- own.lua: reserve units of a window that is its holder's own compact one
-- (window.lua), live: a key's every reservation after its first while one
-- edge's entry alone reserves in it — over many keys, most reservations.
-- It is take.lua's cold path for that one case, with five arguments and
-- nothing prepended (take.lua defines its codec and checks its eighteen
-- arguments on every call): about a third of take.lua's Redis time. In any
-- other case it writes nothing and answers so, and the caller sends
-- take.lua, which decides as it always has.
-- Runs on: the shard primary. Nothing is prepended.
--
-- KEYS[1] -> the window of one (resource, identity) key (keys.go)
-- ARGV[1] -> now, ms since the Unix epoch (the edge's clock)
-- ARGV[2] -> limit, units (1 .. 1e9)
-- ARGV[3] -> need, units (1 .. limit): reserve nothing unless at least
--            this much is left
-- ARGV[4] -> want, units (need .. limit): the most to reserve
-- ARGV[5] -> holder, <producer>.<n> (take.lua's ARGV[7]), 3 to 100 of
--            [A-Za-z0-9_.-]
--
-- The window is the holder's own when KEYS[1] holds a compact window
-- "<u>:<r>:<len>:<holder>[:<back>[:<given>]]" naming ARGV[5] whose reset
-- r (s) is after now. Then, as take.lua's cold path does: when limit - u
-- >= need, u (and given, when written) grows by min(want, limit - u), and
-- only those are written again (SET ... KEEPTTL); its reset, length,
-- holder and expiry stay. The reseed marker is not read, as take.lua's
-- cold path does not read it for the holder's own window (take.lua's
-- header).
--
-- Returns: take.lua's reply, {granted, used, reset_at, start, 0, 0, mine,
--          -1, 1}: mine is given, or u when the window names none (every
--          unit reserved for the holder), and the last 1 says the window is still the holder's
--          own compact one; or {-1} when KEYS[1] is anything else (no key,
--          a window that ended, another holder's, a full one, no window):
--          nothing is written, and take.lua is the call to send.
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local a = ARGV
if #a ~= 5 or string.find(a[1] .. a[2] .. a[3] .. a[4], "%D") or #a[1] > 15 or #a[2] > 10 or #a[3] > 10 or #a[4] > 10
    or a[1] == "" or a[2] == "" or a[3] == "" or a[4] == "" then
  return redis.error_reply("ERR tally: invalid arguments")
end
local now, limit, need, want = tonumber(a[1]), tonumber(a[2]), tonumber(a[3]), tonumber(a[4])
if now > 100000000000000 then return redis.error_reply("ERR tally: invalid now") end
if limit < 1 or limit > 1000000000 then return redis.error_reply("ERR tally: invalid limit") end
if need < 1 or need > limit then return redis.error_reply("ERR tally: invalid need") end
if want < need or want > limit then return redis.error_reply("ERR tally: invalid want") end
local holder = a[5]
if #holder < 3 or #holder > 100 or not string.find(holder, "^[%w_-][%w_.-]*%.[%w_-]+$") then
  return redis.error_reply("ERR tally: invalid holder")
end

local v = redis.pcall("GET", KEYS[1])
if type(v) ~= "string" then
  return { -1 } -- no key, or not a string (a full window's hash)
end
local us, rs, len, h, tail = string.match(v, "^(%d+):(%d+):(%d+):([%w_.-]+)(.*)$")
if us == nil or h ~= holder or #us > 10 or #rs > 11 or #len > 9 then
  return { -1 }
end
local back, given = nil, nil
if tail ~= "" and not string.find(tail, "^:%d+$") then
  back, given = string.match(tail, "^:(%d*):(%d+)$")
  if given == nil or #given > 15 then
    return { -1 }
  end
end
local r = tonumber(rs) * 1000
if r <= now then
  return { -1 } -- the window ended: take.lua opens the next one
end
local u = tonumber(us)
local mine = u
if given ~= nil then
  mine = tonumber(given)
end
local granted = 0
if limit - u >= need then
  granted = math.min(want, limit - u)
  u, mine = u + granted, mine + granted
  if given == nil then
    redis.call("SET", KEYS[1], tostring(u) .. string.sub(v, #us + 1), "KEEPTTL") -- the rest as it was
  else
    redis.call("SET", KEYS[1], string.format("%.0f:%s:%s:%s:%s:%.0f", u, rs, len, h, back, mine), "KEEPTTL")
  end
end
return { granted, u, r, r - tonumber(len) * 1000, 0, 0, mine, -1, 1 }
