-- finish.lua: finish one request an edge admitted for a caller of its
-- decision API, once: record that the request is finished and give back
-- what it asks of its charge (all of it for a 304; what an estimate charged
-- beyond the request's actual cost) to the window its response showed. A request id
-- (a ticket, signed by the edge) can be sent to any edge any number of
-- times; only the first finish changes anything.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1] -> the window of the request's key (keys.go), in either form: a
--            compact one is expanded (window.lua) before anything is given
--            back
-- KEYS[2] -> the finish marks of the request's holder in that window
--            (keys.go): a string of bits, bit n set once the holder's
--            request n of the window is finished. It expires with the
--            window (reset_at + grace). Unused for a request admitted
--            without a window (reset_at 0)
-- KEYS[3] -> the producer hash of the edge that admitted the request
--            (apply.lua's layout). A request admitted without a window is
--            marked finished there, in field f:<charge seq>; a refund whose
--            charge event is not applied yet leaves its marker n:<seq> there
-- KEYS[4] -> the shard's reseed marker (keys.go): while it lasts, nothing
--            is finished (window.lua's reseeding)
-- ARGV[1]  -> now, ms since the Unix epoch
-- ARGV[2]  -> reset_at, ms, a whole second: the window the response showed;
--             0 when the request was admitted without knowledge of its window
--             (fail open): it is then placed by its start, as apply.lua
--             places the charge event that charged it
-- ARGV[3]  -> n, the request's number among its holder's admissions in that
--             window (0 .. 4294967295)
-- ARGV[4]  -> status, 100 .. 599 (the response's)
-- ARGV[5]  -> units the request was charged, 1 .. 1e9
-- ARGV[6]  -> producer: the admitting edge's producer id; what is given back
--             comes out of what it holds in the window (c:<producer>)
-- ARGV[7]  -> charge seq: 0 when the request was charged by a reservation;
--             otherwise the number of the producer's accounting event that
--             charged it (required when reset_at is 0)
-- ARGV[8]  -> start, ms: when the request started; start < reset_at <=
--             start + length + 61000 when reset_at is set
-- ARGV[9]  -> window length, ms (1000 .. 1e12)
-- ARGV[10] -> grace, ms (1000 .. 1e12)
-- ARGV[11] -> skew tolerance, ms (0 .. 1e12), as in apply.lua
-- ARGV[12] -> producer hash lifetime, ms (1000 .. 1e12), as in apply.lua
-- ARGV[13] -> back, units to give back, 0 .. units: all of them for a 304,
--             the charge beyond the request's actual cost for a true-up,
--             else 0. A charge not yet applied nets to zero whole (outcome
--             5) whenever back is above 0: the caller charges again what
--             the request kept
-- ARGV[14] -> linger, ms (0 .. 366 days; "" or absent: 0), as in apply.lua:
--             for a sub-window of a sliding window (reset_at set), how long
--             after its reset it still counts in a span; the request is
--             finished in it until then
--
-- Returns: {outcome, used, reset_at, amount}
--   1 finished          recorded; amount units given back (at most back, at
--                       most what the producer holds in the window, never
--                       below zero); used and reset_at are the window after
--                       it when something was given back
--   2 already finished  nothing changed
--   3 late              the window has ended or been replaced: nothing to
--                       give back, nothing recorded
--   5 pending           recorded; the charge event has not been applied yet:
--                       a marker makes it net to zero when it comes
-- Errors: "ERR tally: invalid <argument>", or WRONGTYPE; nothing is written
-- then. "TALLYRESEEDING": the shard's primary changed; nothing is written.
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local reset = arg_int(2, 0, MAX_MS)
if reset == nil or reset % 1000 ~= 0 then return redis.error_reply("ERR tally: invalid reset_at") end
local n = arg_int(3, 0, 4294967295)
if n == nil then return redis.error_reply("ERR tally: invalid n") end
local status = arg_int(4, 100, 599)
if status == nil then return redis.error_reply("ERR tally: invalid status") end
local units = arg_int(5, 1, MAX_UNITS)
if units == nil then return redis.error_reply("ERR tally: invalid units") end
local producer = ARGV[6]
if not valid_producer(producer) then return redis.error_reply("ERR tally: invalid producer") end
local seq = arg_int(7, 0, 999999999999999)
if seq == nil or (reset == 0 and seq == 0) then return redis.error_reply("ERR tally: invalid charge seq") end
local start = arg_int(8, 0, MAX_MS)
if start == nil then return redis.error_reply("ERR tally: invalid start") end
local len = arg_int(9, 1000, 1000000000000)
if len == nil then return redis.error_reply("ERR tally: invalid window length") end
if reset > 0 and (start >= reset or reset > start + len + MAX_RESET_AHEAD) then
  return redis.error_reply("ERR tally: invalid reset_at")
end
local grace = arg_int(10, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end
local tol = arg_int(11, 0, 1000000000000)
if tol == nil then return redis.error_reply("ERR tally: invalid skew tolerance") end
local ttl = arg_int(12, 1000, 1000000000000)
if ttl == nil then return redis.error_reply("ERR tally: invalid producer lifetime") end
local back = arg_int(13, 0, units)
if back == nil then return redis.error_reply("ERR tally: invalid back") end
local linger = 0
if (ARGV[14] or "") ~= "" then
  linger = arg_int(14, 0, 31622400000)
  if linger == nil or (linger > 0 and reset == 0) then return redis.error_reply("ERR tally: invalid linger") end
end

if reseeding(KEYS[4]) then
  return redis.error_reply("TALLYRESEEDING the shard's windows are being re-asserted")
end

-- Read every key before the first write.
local w = load(KEYS[1], grace)
local pf = redis.call("HMGET", KEYS[3], "s", "c", "g")
local ps, pc, pg = tonumber(pf[1]) or 0, tonumber(pf[2]) or 0, tonumber(pf[3]) or 0
local marked
if reset > 0 then
  marked = redis.call("GETBIT", KEYS[2], n) == 1
else
  marked = redis.call("HEXISTS", KEYS[3], "f:" .. num(seq)) == 1
end

-- The window the request counts in, live.
local live
if reset > 0 then
  live = w ~= nil and w.r == reset and w.r + linger > now
else
  live = place(w, start, now, len, tol, grace) == "live"
end

-- applied reports whether the producer's event s has been applied.
local function applied(s)
  if s > ps then return false end
  if pg == 0 then return true end
  for _, gp in ipairs(gaps_of(KEYS[3])) do
    if s >= gp[1] and s <= gp[2] then return false end
  end
  return true
end
local charged = seq == 0 or applied(seq)

if marked then
  return { 2, 0, 0, 0 }
end
if not live and charged then
  return { 3, 0, 0, 0 }
end

-- Record the finish.
if reset > 0 then
  redis.call("SETBIT", KEYS[2], n, 1)
  redis.call("PEXPIREAT", KEYS[2], num(reset + grace + linger))
else
  redis.call("HSET", KEYS[3], "f:" .. num(seq), "1")
  redis.call("PEXPIRE", KEYS[3], num(ttl))
end
if back == 0 then
  return { 1, 0, 0, 0 }
end
if not charged then
  -- The charge is still on its way: it nets to zero when it comes.
  redis.call("HSET", KEYS[3], "n:" .. num(seq), num(units), "c", num(pc + 1))
  redis.call("PEXPIRE", KEYS[3], num(ttl))
  return { 5, 0, 0, 0 }
end
local field = "c:" .. producer
local have = held_by(KEYS[1], w, producer)
local amount = math.min(back, w.u, have)
touch_span(KEYS[1], w.r)
expand(KEYS[1], w, grace + linger)
w.u = w.u - amount
redis.call("HSET", KEYS[1], "u", num(w.u), field, num(have - amount))
return { 1, w.u, w.r, amount }
