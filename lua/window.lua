-- window.lua: the window model shared by take.lua, apply.lua, finish.lua,
-- hold.lua and reseed.lua. lua.go prepends this file to each of them, after
-- compact.lua (the arguments' checks and the compact form's codec, which it
-- uses); it is never run on its own.
--
-- A window is stored under one key per (resource, identity), in one of two
-- forms (docs/windows.md):
--
-- compact: one string, "<u>:<r>:<len>:<holder>", "<u>:<r>:<len>:<holder>:<back>"
--   or "<u>:<r>:<len>:<holder>:<back>:<given>" (back may be empty there),
--   what a window is while one holder (an edge's table entry) alone has
--   reserved in it and only its producer's events have changed it: u units
--   used, all of them held by the holder's producer; r the reset and len
--   the length, in whole seconds (the start is r - len); back, when the
--   window replaced one that had ended, how many seconds before the start
--   its earliest accepted event start lies (without it: grace less one
--   second); given, every unit ever reserved for the holder, when that is
--   not u (the producer gave some back, or charged more). The holder is
--   <producer>.<n> with n of [A-Za-z0-9_-]. An edge opens a window in this
--   form with one SET ... NX PXAT (no script; redisstore's batch.go),
--   take.lua opens one where no window is live and keeps it so while only
--   its holder reserves, and apply.lua keeps it so for the holder's
--   producer's charges, refunds and releases; any other change expands it
--   (expand) into the full form first.
--
-- full: one Redis hash:
--   u   units used in the window, units reserved by edges included
--   s   start of the window, ms since the Unix epoch: the whole second its
--       first request (or event) fell in
--   r   reset_at, ms since the Unix epoch: s + the window's length, a whole
--       second (s is one); the window is live while now < r and r never
--       changes once written
--   p   the earliest event start the window accepts: the previous window's
--       reset_at, or (for a first window) its start less grace plus one
--       second, later than any start whose window could already have been
--       garbage collected
--   c:<producer>  the units one producer holds in the window: what its
--       reservations (take.lua) and charges (apply.lua) added, less what its
--       refunds and releases gave back. A producer never gives back more
--       than it holds: no one can refund another producer's charges
--   g:<holder>    every unit ever reserved for one holder (take.lua)
--   z:<holder>    the units of its credit a holder will not spend, until
--       when, and its producer (hold.lua); taken back by take.lua once
--       expired
--   t:<holder>    set when take.lua took a holder's share back: a reseed does
--       not make that share again (reseed.lua)
--   h   the reseed that opened the window, when one did (reseed.lua)
--   v:<producer>  "<reseed>:<from>:<to>": the producer's accounting events
--       for this window numbered from < seq <= to are counted in it by that
--       reseed's re-assertion; apply.lua takes them as applied
--
-- A compact window is the full one with u, s, r, p, g:<holder> = given
-- (u when not written) and c:<producer> = u. Either expires at r + grace; expiry is garbage
-- collection only, every read compares r with the caller's clock.

-- A window resets at most its length and this much (ms) after a request
-- in it started: a second of rounding, and a minute for clocks that differ.
local MAX_RESET_AHEAD = 61000

-- gaps_of returns the gaps of the producer whose hash is key ({from, to}
-- pairs: numbers below its highest applied one not applied yet; apply.lua's
-- layout).
local function gaps_of(key)
  local out = {}
  local all = redis.call("HGETALL", key)
  for j = 1, #all, 2 do
    if string.sub(all[j], 1, 2) == "g:" then
      local from, to = tonumber(string.sub(all[j], 3)), tonumber(all[j + 1])
      if from ~= nil and to ~= nil then
        table.insert(out, { from, to })
      end
    end
  end
  return out
end

-- applied_prefix returns the highest n such that every event 1..n of the
-- producer whose hash is key has been applied: its highest applied number,
-- or below the oldest number it is still missing (a gap, when a later batch
-- was applied first).
local function applied_prefix(key)
  local f = redis.call("HMGET", key, "s", "g")
  local applied = tonumber(f[1]) or 0
  if (tonumber(f[2]) or 0) > 0 then
    for _, gp in ipairs(gaps_of(key)) do
      applied = math.min(applied, gp[1] - 1)
    end
  end
  return applied
end

-- reseeding reports whether a reseed of the shard halts writes now: its
-- marker (epoch.lua) lasts, with an expiry no longer than the longest
-- reseed_for (a marker without one, or a longer one, no process set).
-- Every script that changes windows calls it first and writes nothing
-- while it holds: what the edges re-assert must land before anything else.
local function reseeding(key)
  local t = redis.call("PTTL", key)
  return t > 0 and t <= 600000
end

-- touch_span keeps a sliding window's span record true after a script
-- changes the sub-window stored at key, which resets at r (ms). The record
-- (keys.go's SpanRecordKey: the window key and ":s"; a sub-window's key is
-- the window key, ":" and its reset in whole seconds) says what the other
-- sub-windows of one sub-window's spans hold, for slide.lua to reserve
-- there without reading them: "<reset s>:<len s>:<slices>:<extra>:<level>".
-- It holds while none of those others changes, so a change to a sub-window
-- other than the one it names removes it; a change to that one keeps it
-- (slide.lua reads that sub-window itself). A key that is no sub-window's
-- is left alone; a record that is not a string is removed.
local function touch_span(key, r)
  local base = string.match(key, "^(.*}):%d+$")
  if base == nil then
    return
  end
  local rec = base .. ":s"
  local v = redis.pcall("GET", rec)
  if v and (type(v) ~= "string" or string.match(v, "^(%d+):") ~= string.format("%.0f", r / 1000)) then
    redis.call("DEL", rec)
  end
end

-- read returns the window stored at key and its form: nil, nil when the key
-- holds nothing; w, "compact" (w.holder and w.producer set); w, "full"; or
-- nil, "full" for a hash without a window (a key that moved: field "m").
-- For a full window it also returns the hash's fields named in extra, read
-- in the same call (f[5], f[6], ...). A string that is no compact window
-- fails the call (nothing is written).
local function read(key, grace, extra)
  local v = redis.pcall("GET", key)
  if type(v) == "string" then
    local w = decode(v, grace)
    if w ~= nil then
      w.producer = holder_producer(w.holder)
    end
    if w == nil or w.producer == nil then
      error("ERR tally: unreadable window at " .. key)
    end
    return w, "compact", {}
  end
  if not v then
    return nil, nil, {}
  end
  local f = redis.call("HMGET", key, "u", "s", "r", "p", unpack(extra or {}))
  local r = tonumber(f[3])
  local s = tonumber(f[2])
  if r == nil or s == nil then
    return nil, "full", f
  end
  return { u = tonumber(f[1]) or 0, s = s, r = r, p = tonumber(f[4]) or 0 }, "full", f
end

-- load reads the window stored at key, in either form, or returns nil when
-- there is none.
local function load(key, grace)
  return (read(key, grace))
end

-- held_by returns what producer holds in w, the window stored at key
-- (c:<producer>): a compact window's holder's producer holds all of it, as
-- read (w.held).
local function held_by(key, w, producer)
  if w.holder ~= nil then
    if w.producer == producer then
      return w.held
    end
    return 0
  end
  return tonumber(redis.call("HGET", key, "c:" .. producer)) or 0
end

-- expand writes the compact window w, stored at key, in the full form (the
-- same window: u, s, r, p, what its holder was given, w.mine, and what its
-- producer holds, all of u as read, w.held), expiring at r + grace, for a
-- change the compact form cannot hold. w is full afterwards. Nothing to do
-- for a full window.
local function expand(key, w, grace)
  if w == nil or w.holder == nil then
    return
  end
  redis.call("DEL", key)
  redis.call("HSET", key, "u", num(w.u), "s", num(w.s), "r", num(w.r), "p", num(w.p), "g:" .. w.holder, num(w.mine),
    "c:" .. w.producer, num(w.held))
  redis.call("PEXPIREAT", key, num(w.r + grace))
  w.holder, w.producer = nil, nil
end

-- fresh returns a new window opened by a request at t, used 0, accepting
-- starts back to p. It is written by save.
local function fresh(t, len, p)
  local s = opening(t, len)
  return { u = 0, s = s, r = s + len, p = p, new = true }
end

-- ending returns a new window that resets at r (a whole second), as opened by
-- whoever showed that reset, accepting starts back to p.
local function ending(r, len, p)
  return { u = 0, s = r - len, r = r, p = p, new = true }
end

-- save writes w to key: the count, and for a new window every field and the
-- expiry (reset + grace), replacing whatever the key held.
local function save(key, w, grace)
  if w.new then
    redis.call("DEL", key)
    redis.call("HSET", key, "u", num(w.u), "s", num(w.s), "r", num(w.r), "p", num(w.p))
    redis.call("PEXPIREAT", key, num(w.r + grace))
    w.new = false
  else
    redis.call("HSET", key, "u", num(w.u))
  end
end

-- place finds the window an event that started at t belongs to, given the
-- stored window w (nil when none) at time now. t is clamped to now first (a
-- clock running ahead cannot open a window in the future).
--   "live", w       w is live and t belongs to it
--   "new", p, t     no live window holds t; one may open at t, accepting
--                   starts back to p
--   "late"          t's window has closed or was replaced
local function place(w, t, now, len, tol, grace)
  if t > now then
    t = now
  end
  if w == nil then
    -- Nothing stored: any window that held t and was garbage collected
    -- ended at least grace ago, so only a start newer than that may open one.
    if t > now - grace and opening(t, len) + len > now then
      return "new", now - grace, t
    end
    return "late"
  end
  if t >= w.r then
    if opening(t, len) + len > now then
      return "new", w.r, t
    end
    return "late"
  end
  if w.r <= now then
    return "late"
  end
  if t >= w.s or (t >= w.s - tol and t >= w.p) then
    return "live", w
  end
  return "late"
end
