-- hold.lua: record the share of an edge's credit in a window that the edge
-- promises not to spend (its frozen units), until expiry. An edge reports
-- it every quarter of a second for the windows where it holds more credit
-- than it can spend in about a second; it spends frozen units only after a
-- later call here has lowered them. When the edge dies, its reports stop:
-- once a share has expired, a reservation that finds no room takes it back
-- (take.lua), so that the credit of a dead edge comes back to its window —
-- never units the edge may have spent.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window (keys.go), in either form: a compact one is
--            expanded (window.lua) before a share is recorded in it
-- KEYS[2] -> the shard's reseed marker (keys.go): while it lasts, nothing
--            is recorded (window.lua's reseeding)
-- ARGV[1] -> now, ms since the Unix epoch
-- ARGV[2] -> reset_at, ms: the window the credit is in
-- ARGV[3] -> holder, as in take.lua: the edge's table entry
-- ARGV[4] -> producer, the edge's producer id; the holder begins with it
-- ARGV[5] -> expected: the units the caller last saw frozen here for the
--            holder (0: none). The call changes nothing unless the window
--            holds exactly these: otherwise a share was taken back, or a
--            report whose answer was lost changed it
-- ARGV[6] -> frozen: the units frozen from now (0 .. 1e9; 0 removes the
--            share)
-- ARGV[7] -> expiry, ms: when the share may be taken back
-- ARGV[8] -> grace, ms (1000 .. 1e12), as in take.lua
--
-- Returns: {outcome, have}
--   0 recorded: have is frozen
--   1 the window holds have frozen units for the holder, not expected:
--     nothing changed
--   2 no such window (reset, or another): nothing changed
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
--         "TALLYRESEEDING": the shard's primary changed; nothing is written.
--
-- The share is the window's field "z:<holder>" = "<frozen>:<expiry>:<producer>".
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local reset = arg_int(2, 1, MAX_MS)
if reset == nil then return redis.error_reply("ERR tally: invalid reset_at") end
local holder = ARGV[3]
if type(holder) ~= "string" or #holder < 1 or #holder > 100 or not string.match(holder, "^[%w_.-]+$") then
  return redis.error_reply("ERR tally: invalid holder")
end
local producer = ARGV[4]
if not valid_producer(producer) or (holder ~= producer and string.sub(holder, 1, #producer + 1) ~= producer .. ".") then
  return redis.error_reply("ERR tally: invalid producer")
end
local expected = arg_int(5, 0, MAX_UNITS)
if expected == nil then return redis.error_reply("ERR tally: invalid expected") end
local frozen = arg_int(6, 0, MAX_UNITS)
if frozen == nil then return redis.error_reply("ERR tally: invalid frozen") end
local expiry = arg_int(7, 0, MAX_MS)
if expiry == nil then return redis.error_reply("ERR tally: invalid expiry") end
local grace = arg_int(8, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end

if reseeding(KEYS[2]) then
  return redis.error_reply("TALLYRESEEDING the shard's windows are being re-asserted")
end
local field = "z:" .. holder
local w, form, f = read(KEYS[1], grace, { field })
if w == nil or w.r ~= reset or reset <= now then
  return { 2, 0 }
end
local have = 0
if form == "full" and f[5] then
  have = tonumber(string.match(f[5], "^(%d+):")) or 0
end
if have ~= expected then
  return { 1, have }
end
if frozen == 0 then
  if have > 0 then
    redis.call("HDEL", KEYS[1], field)
  end
else
  expand(KEYS[1], w, grace)
  redis.call("HSET", KEYS[1], field, num(frozen) .. ":" .. num(expiry) .. ":" .. producer)
end
return { 0, frozen }
