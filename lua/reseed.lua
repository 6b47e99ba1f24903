-- reseed.lua: during a reseed (epoch.lua), re-assert what one holder (an
-- edge's table entry) was given in one live window, so that the window
-- counts at least what its clients were allowed after its primary changed
-- or came back empty. Re-asserting twice is re-asserting once.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- What a primary that took over can have lost is the end of what the old
-- one did: reservations (take.lua), accounting events applied (apply.lua),
-- reports of frozen shares (hold.lua), finishes (finish.lua). What it holds
-- is all of what the old one did up to some point, or nothing. So:
--   - a window it holds (opened before this reseed) gets back the
--     reservations it lost: the holder's count g:<holder> rises to what the
--     holder was given, and the window's count and the producer's share
--     c:<producer> by as much. Its accounting events need nothing: those
--     the stream deleted are on every replica, the others are applied again
--     from the stream (or sent again by the edge that applied them itself);
--   - a window it does not hold is opened as the holder knew it (the same
--     start and reset), marked "h" = this reseed, and the producer's whole
--     part is added: what it reserved plus its charges less its refunds and
--     releases (its accounting events for the window numbered from < seq <=
--     to, field v:<producer> = "<epoch>:<from>:<to>", which apply.lua then
--     treats as applied). Another holder of the same window in this reseed
--     adds its own part the same way; the same producer twice, its
--     reservations only;
--   - the holder's frozen share z:<holder> is what the holder last had
--     recorded, unless the share was taken back (t:<holder>, take.lua).
--
-- KEYS[1] -> the window (keys.go), in either form: a compact one is
--            expanded first (window.lua)
-- ARGV[1]  -> now, ms since the Unix epoch
-- ARGV[2]  -> epoch: the reseed's id, 16 of [0-9a-f] (epoch.lua)
-- ARGV[3]  -> reset_at, ms, a whole second, after now
-- ARGV[4]  -> start, ms: start < reset_at <= start + length + 61000
-- ARGV[5]  -> window length, ms (1000 .. 1e12)
-- ARGV[6]  -> grace, ms (1000 .. 1e12): the hash expires at reset_at + grace
-- ARGV[7]  -> holder, as in take.lua
-- ARGV[8]  -> producer, as in take.lua; the holder begins with it
-- ARGV[9]  -> reserved: every unit reserved for the holder in the window
--             (0 .. 1e15)
-- ARGV[10] -> charged: units of the producer's charge events for this
--             window from < seq <= to (0 .. 1e15)
-- ARGV[11] -> given back: units of its refund and release events for this
--             window from < seq <= to (0 .. 1e15)
-- ARGV[12] -> from, ARGV[13] -> to: the producer's event numbers the claim
--             covers (0 <= from <= to <= 999999999999999; equal: none)
-- ARGV[14] -> frozen: the holder's share as it last had it recorded
--             (0 .. 1e9; 0: none)
-- ARGV[15] -> the share's expiry, ms
-- ARGV[16] -> linger, ms (0 .. 366 days; "" or absent: 0): for a sub-window
--             of a sliding window, how long after its reset it still counts
--             in a span (apply.lua's linger): it is re-asserted until then,
--             and a window opened here expires at reset_at + grace + linger
--
-- Returns: {outcome, used, added}
--   outcome 1 opened (the window was not held: opened and seeded)
--           2 seeded (a window held from before the reseed, or opened by it)
--           3 conflict: another window of the key is live (opened after
--             the reseed ended): nothing changed
--           4 late: reset_at (and the linger after it) has passed: nothing
--             changed
--   used    the window's count after the call (0 for 4)
--   added   units added to the count
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local epoch = ARGV[2]
if type(epoch) ~= "string" or #epoch ~= 16 or not string.match(epoch, "^[0-9a-f]+$") then
  return redis.error_reply("ERR tally: invalid epoch")
end
local reset = arg_int(3, 1000, MAX_MS)
if reset == nil or reset % 1000 ~= 0 then return redis.error_reply("ERR tally: invalid reset_at") end
local start = arg_int(4, 0, MAX_MS)
local len = arg_int(5, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
if start == nil or start >= reset or reset > start + len + MAX_RESET_AHEAD then
  return redis.error_reply("ERR tally: invalid start")
end
local grace = arg_int(6, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end
local holder = ARGV[7]
if type(holder) ~= "string" or #holder < 1 or #holder > 100 or not string.match(holder, "^[%w_.-]+$") then
  return redis.error_reply("ERR tally: invalid holder")
end
local producer = ARGV[8]
if not valid_producer(producer) or (holder ~= producer and string.sub(holder, 1, #producer + 1) ~= producer .. ".") then
  return redis.error_reply("ERR tally: invalid producer")
end
local BIG = 999999999999999
local reserved = arg_int(9, 0, BIG)
local charged = arg_int(10, 0, BIG)
local given = arg_int(11, 0, BIG)
if reserved == nil or charged == nil or given == nil then
  return redis.error_reply("ERR tally: invalid units")
end
local from = arg_int(12, 0, BIG)
local to = arg_int(13, 0, BIG)
if from == nil or to == nil or to < from then return redis.error_reply("ERR tally: invalid range") end
local frozen = arg_int(14, 0, MAX_UNITS)
local expiry = arg_int(15, 0, MAX_MS)
if frozen == nil or expiry == nil then return redis.error_reply("ERR tally: invalid frozen") end
local linger = 0
if (ARGV[16] or "") ~= "" then
  linger = arg_int(16, 0, 31622400000)
  if linger == nil then return redis.error_reply("ERR tally: invalid linger") end
end

if reset + linger <= now then
  return { 4, 0, 0 }
end
touch_span(KEYS[1], reset)
local gf, cf, zf, tf, vf = "g:" .. holder, "c:" .. producer, "z:" .. holder, "t:" .. holder, "v:" .. producer
local cw, form = read(KEYS[1], grace)
if form == "compact" then
  if cw.r + linger > now then
    expand(KEYS[1], cw, grace + linger)
  else
    redis.call("DEL", KEYS[1])
  end
end
local f = redis.call("HMGET", KEYS[1], "u", "s", "r", "h", gf, cf, zf, tf, vf)
local w = nil
if tonumber(f[3]) ~= nil and tonumber(f[2]) ~= nil and tonumber(f[3]) + linger > now then
  w = { u = tonumber(f[1]) or 0, r = tonumber(f[3]) }
end
local outcome = 2
if w == nil then
  -- Not held: opened as the holder knew it. Events that started before it
  -- may still count in it, as far back as a window opened at its start
  -- would have accepted (window.lua's p).
  redis.call("DEL", KEYS[1])
  redis.call("HSET", KEYS[1], "u", "0", "s", num(start), "r", num(reset), "p", num(math.min(start, now - grace)), "h", epoch)
  redis.call("PEXPIREAT", KEYS[1], num(reset + grace + linger))
  w = { u = 0, r = reset }
  f = { false, false, false, epoch, false, false, false, false, false }
  outcome = 1
elseif w.r ~= reset then
  return { 3, w.u, 0 }
end

local g = tonumber(f[5]) or 0
local c = tonumber(f[6]) or 0
local add = math.max(0, reserved - g)
if f[4] == epoch then
  -- Opened by this reseed: the producer's whole part, once.
  local claimed = f[9] and string.match(f[9], "^(%x+):") == epoch
  if not claimed then
    add = reserved + charged - given - g
    redis.call("HSET", KEYS[1], vf, epoch .. ":" .. num(from) .. ":" .. num(to))
  end
end
local held = math.max(0, c + add)
local u = math.max(0, w.u + held - c)
local fields = { "u", num(u), cf, num(held) }
if reserved > g then
  table.insert(fields, gf)
  table.insert(fields, num(reserved))
end
-- The frozen share as the holder last had it: lost reports are made
-- again; a share taken back stays taken.
if frozen > 0 then
  local have = nil
  if f[7] then
    have = tonumber(string.match(f[7], "^(%d+):"))
  end
  if (have ~= nil and have ~= frozen) or (have == nil and not f[8]) then
    table.insert(fields, zf)
    table.insert(fields, num(frozen) .. ":" .. num(expiry) .. ":" .. producer)
  end
end
redis.call("HSET", KEYS[1], unpack(fields))
return { outcome, u, u - w.u }
