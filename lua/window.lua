-- window.lua: the window model shared by open.lua, charge.lua and refund.lua.
-- lua.go prepends this file to each of them; it is never run on its own and
-- touches no key but KEYS[1].
--
-- A window is one Redis hash per (resource, identity) key:
--   u           units used in the window
--   s           start of the window, ms since the Unix epoch
--   r           reset_at, ms since the Unix epoch, a whole second; the window is
--               live while now < r and never changes r once written
--   p           the earliest event start the window accepts: the previous
--               window's reset_at, or (for a first window) the oldest start
--               whose window could already have been garbage collected
--   e:<hex>     one record per event id digest (see charge.lua, refund.lua)
--
-- The hash expires at r + grace; expiry is garbage collection only, every read
-- compares r with the caller's clock.

-- Largest accepted millisecond timestamp or duration (year 5138; exact in a
-- Lua double).
local MAX_MS = 100000000000000

-- arg_int returns ARGV[i] as an integer in [lo, hi], or nil when it is not
-- made of 1 to 15 decimal digits or lies outside the range.
local function arg_int(i, lo, hi)
  local s = ARGV[i]
  if type(s) ~= "string" or #s < 1 or #s > 15 or not string.match(s, "^%d+$") then
    return nil
  end
  local v = tonumber(s)
  if v < lo or v > hi then
    return nil
  end
  return v
end

-- arg_field returns ARGV[i] when it is an event record field: "e:" followed
-- by exactly 32 lower-case hex digits.
local function arg_field(i)
  local s = ARGV[i]
  if type(s) ~= "string" or #s ~= 34 or not string.match(s, "^e:[0-9a-f]+$") then
    return nil
  end
  return s
end

-- num renders an integer-valued number without an exponent.
local function num(v)
  return string.format("%.0f", v)
end

-- load reads the stored window, or returns nil when there is none or it is
-- unreadable. With a field, it reads that event record in the same call and
-- returns it in w.rec (false when absent).
local function load(field)
  local f
  if field then
    f = redis.call("HMGET", KEYS[1], "u", "s", "r", "p", field)
  else
    f = redis.call("HMGET", KEYS[1], "u", "s", "r", "p")
  end
  local r = tonumber(f[3])
  local s = tonumber(f[2])
  if r == nil or s == nil then
    return nil
  end
  return { u = tonumber(f[1]) or 0, s = s, r = r, p = tonumber(f[4]) or 0, rec = f[5] or false }
end

-- create replaces whatever the key holds with a fresh window starting at t,
-- with used = u and, when field is given, one record. It returns the window.
local function create(t, len, grace, p, u, field, record)
  local r = t + len
  r = r + (1000 - r % 1000) % 1000
  redis.call("DEL", KEYS[1])
  if field then
    redis.call("HSET", KEYS[1], "u", num(u), "s", num(t), "r", num(r), "p", num(p), field, record)
  else
    redis.call("HSET", KEYS[1], "u", num(u), "s", num(t), "r", num(r), "p", num(p))
  end
  redis.call("PEXPIREAT", KEYS[1], num(r + grace))
  return { u = u, s = t, r = r, p = p }
end

-- place finds the window an event that started at t belongs to, at time now,
-- and reads the event's record (field) with it.
-- t is clamped to now first (an edge whose clock runs ahead cannot open a
-- window in the future); the clamped t is always the third result:
--   "live", w, t    w is stored and live, and t belongs to it; w.rec is the
--                   event's record, false when there is none
--   "new", p, t     no live window holds t; a new one may open at t, with p as
--                   its earliest accepted start
--   "late", nil, t  the event's window has closed (or was replaced): it must
--                   not touch the current window
local function place(t, now, len, tol, grace, field)
  if t > now then
    t = now
  end
  local w = load(field)
  if w == nil then
    -- Nothing stored: any window that held t and was garbage collected
    -- ended at least grace ago, so only a start newer than that may open one.
    if t > now - grace and t + len > now then
      return "new", now - grace, t
    end
    return "late", nil, t
  end
  if t >= w.r then
    -- The stored window ended before the event started: the event opens the
    -- next one, unless that one would already be over too.
    if t + len > now then
      return "new", w.r, t
    end
    return "late", nil, t
  end
  if w.r <= now then
    return "late", nil, t
  end
  if t >= w.s or (t >= w.s - tol and t >= w.p) then
    return "live", w, t
  end
  return "late", nil, t
end
