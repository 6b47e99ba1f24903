-- apply.lua: apply a run of accounting events to windows, each at most once.
-- Events come from producers (edge-checkers, or services that publish their
-- own), each numbering its events per shard 1, 2, 3, ... A producer hash
-- remembers the highest sequence applied and the gaps below it (numbers not
-- applied yet, when events arrive out of order: a batch an edge applied
-- itself while an earlier one waits in the stream), so a redelivered,
-- republished or retried event changes nothing, a late one is still applied,
-- and the memory this takes does not grow with traffic.
-- Runs on: the shard primary. lua.go prepends window.lua.
--
-- KEYS[1..P]  -> producer hashes (keys.go):
--                  s        the highest sequence of the producer applied here
--                  g        how many gaps there are (at most 64; beyond, the
--                           oldest is forgotten and its numbers count as
--                           applied)
--                  g:<a>    "<b>": numbers a to b, below s, not applied yet
--                  c        how many n:<seq> markers there are (at most
--                           10000; beyond, a refund that comes before its
--                           charge is late: it changes nothing)
--                  n:<seq>  a refund that arrived before its charge <seq>:
--                           the charge, when it comes, nets to zero
--                They expire ARGV[5] ms after their last write.
-- KEYS[P+1..] -> windows (keys.go), each named once, in either form: a
--                compact one stays compact while only its holder's
--                producer's events change it, and is expanded for any
--                other's (window.lua)
-- KEYS[#KEYS-1] -> when ARGV[6] names a call: the caller's reply key
--                (keys.go), a string "<call>|<count>|<reply>" holding what
--                the last call through it returned (<reply> in MessagePack)
-- KEYS[#KEYS] -> the shard's reseed marker (keys.go): while it lasts, no
--                event is applied (window.lua's reseeding)
-- ARGV[1] -> now, ms since the Unix epoch
-- ARGV[2] -> P, the number of producer hashes (1 .. 1000)
-- ARGV[3] -> grace, ms (1000 .. 1e12): see window.lua
-- ARGV[4] -> skew tolerance, ms (0 .. 1e12): an event placed by its start may
--            have started up to this much before its window
-- ARGV[5] -> producer hash lifetime, ms (1000 .. 1e12): longer than an event
--            can wait in the stream
-- ARGV[6] -> call, 0 .. 999999999999999: 0 for none; otherwise the caller's
--            number for this run of events, the same each time it sends the
--            same run again. When the reply key holds this call's reply, the
--            script returns it and changes nothing: a call whose answer was
--            lost (a timeout after the primary ran it) and is tried again
--            learns what it did, instead of finding its events applied
--            before (duplicate).
-- ARGV[7] -> reply lifetime, ms (1000 .. 1e12): how long the reply key is kept
-- ARGV[8 .. 7+P] -> the producer ids of KEYS[1..P] (keys.go's ValidProducer):
--            what a producer charges and gives back is counted in each
--            window's c:<producer> (window.lua)
-- ARGV[8+P ..] -> events, 11 arguments each (a producer's usually in order):
--   1 producer    index into KEYS (1 .. P)
--   2 seq         the producer's sequence number (1 .. 999999999999999)
--   3 kind        "c" charge units; "r" refund units of an earlier charge;
--                 "x" release units an edge reserved and did not use
--   4 window      index into KEYS (P+1 .. #KEYS)
--   5 reset_at    ms, a whole second: the window the event belongs to, as the
--                 edge's response showed it; 0: place the event by its start.
--                 A window resets after its requests start, and at most its
--                 length and 61 s (rounding, clocks) after: start < reset_at
--                 <= start + length + 61000
--   6 start       ms: when the request started (used when reset_at is 0)
--   7 length      window length, ms (1000 .. 1e12): of the window the event
--                 names, which a calendar policy's events always name by
--                 reset_at (a month of 28 to 31 days, a day of 23 to 25
--                 hours), so that a window they open starts at reset_at -
--                 length, the period's first midnight
--   8 units       1 .. 1e9
--   9 ref         refunds only: the event's own producer index when it names
--                 the charge it refunds (a producer refunds only its own
--                 charges), or 0 when the charge was a reservation
--  10 ref seq     refunds with a ref: the charge's sequence, below the
--                 refund's own; otherwise 0
--  11 linger      ms (0 .. 366 days): 0 for a window, which ends at its
--                 reset; for a sub-window of a sliding window (named by
--                 reset_at, never by start), how long after its reset it
--                 still counts in a span: the event applies to it until
--                 then, and a window the event opens expires that much
--                 later (reset_at + grace + linger)
--
-- Rules:
--   charge   by reset_at: added to that window while it is live; opens it
--            when no window is live (a primary that lost its data); late
--            when another window has replaced it or it has ended.
--            by start: see place in window.lua. A charge whose refund came
--            first nets to zero. Counted in c:<producer>.
--   refund   given back to the charge's window while it is live: at most
--            what the producer holds in it (c:<producer>), never below zero;
--            when its charge has not been applied yet, it is kept as a
--            marker and the charge nets to zero.
--   release  like a refund of a reservation.
--   Nothing is written before every key has been read: a key of the wrong
--   type fails the whole call before its first write.
--
-- Returns: a flat list, 4 values per event: outcome, used, reset_at, amount
--   outcome 1 applied    used: the window's units after it, amount: added or
--                        given back (for a refund, at most what the producer
--                        held in the window). An event a reseed's
--                        re-assertion of its window counted already
--                        (v:<producer>, reseed.lua) is applied too: it
--                        changes nothing more, and amount is its units
--           2 duplicate  the producer's event was applied before (or its
--                        number is older than every gap remembered)
--           3 late       its window has ended or been replaced (or, for a
--                        refund before its charge, the producer has too many
--                        such refunds waiting)
--           4 netted     a charge whose refund came first
--           5 pending    a refund whose charge has not come yet
--   used, reset_at and amount are 0 unless the outcome is applied.
-- Errors: "ERR tally: invalid <argument>", or WRONGTYPE for a key that holds
-- another kind of value; nothing is written then. "TALLYRESEEDING": the
-- shard's primary changed and its windows are being re-asserted; nothing is
-- written (a call sent again still gets what it did the first time).
local now = arg_int(1, 0, MAX_MS)
if now == nil then return redis.error_reply("ERR tally: invalid now") end
local np = arg_int(2, 1, 1000)
if np == nil then return redis.error_reply("ERR tally: invalid producer count") end
local grace = arg_int(3, 1000, 1000000000000)
if grace == nil then return redis.error_reply("ERR tally: invalid grace") end
local tol = arg_int(4, 0, 1000000000000)
if tol == nil then return redis.error_reply("ERR tally: invalid skew tolerance") end
local ttl = arg_int(5, 1000, 1000000000000)
if ttl == nil then return redis.error_reply("ERR tally: invalid producer lifetime") end
local call = arg_int(6, 0, 999999999999999)
if call == nil then return redis.error_reply("ERR tally: invalid call") end
local replyTTL = arg_int(7, 1000, 1000000000000)
if replyTTL == nil then return redis.error_reply("ERR tally: invalid reply lifetime") end
local marker = #KEYS
local replyKey = #KEYS - 1
local lastWin = #KEYS - 1
if call > 0 then lastWin = #KEYS - 2 end
if np > lastWin then return redis.error_reply("ERR tally: invalid producer count") end
local names = {}
for i = 1, np do
  names[i] = ARGV[7 + i]
  if not valid_producer(names[i]) then return redis.error_reply("ERR tally: invalid producer id " .. i) end
end
local FIELDS = 11
local first = 7 + np
local nev = (#ARGV - first) / FIELDS
if nev < 0 or nev ~= math.floor(nev) then return redis.error_reply("ERR tally: invalid event count") end

-- Validate every event before the first write.
local evs = {}
for i = 1, nev do
  local b = first + (i - 1) * FIELDS
  local e = {
    prod = arg_int(b + 1, 1, np), seq = arg_int(b + 2, 1, 999999999999999), kind = ARGV[b + 3],
    win = arg_int(b + 4, np + 1, lastWin), reset = arg_int(b + 5, 0, MAX_MS), start = arg_int(b + 6, 0, MAX_MS),
    len = arg_int(b + 7, 1000, 1000000000000), units = arg_int(b + 8, 1, MAX_UNITS),
    ref = arg_int(b + 9, 0, np), refseq = arg_int(b + 10, 0, 999999999999999),
    linger = arg_int(b + 11, 0, 31622400000),
  }
  local bad = nil
  if e.prod == nil then bad = "producer"
  elseif e.seq == nil then bad = "seq"
  elseif e.kind ~= "c" and e.kind ~= "r" and e.kind ~= "x" then bad = "kind"
  elseif e.win == nil then bad = "window"
  elseif e.reset == nil or e.reset % 1000 ~= 0 then bad = "reset_at"
  elseif e.start == nil then bad = "start"
  elseif e.len == nil then bad = "window length"
  elseif e.units == nil then bad = "units"
  elseif e.ref == nil or e.refseq == nil then bad = "ref"
  elseif e.kind ~= "r" and (e.ref ~= 0 or e.refseq ~= 0) then bad = "ref"
  elseif e.kind == "r" and (e.ref == 0) ~= (e.refseq == 0) then bad = "ref"
  elseif e.ref ~= 0 and (e.ref ~= e.prod or e.refseq >= e.seq) then bad = "ref"
  elseif e.kind ~= "c" and e.ref == 0 and e.reset == 0 then bad = "reset_at"
  elseif e.reset > 0 and (e.start >= e.reset or e.reset > e.start + e.len + MAX_RESET_AHEAD) then bad = "reset_at"
  elseif e.linger == nil or (e.linger > 0 and e.reset == 0) then bad = "linger"
  end
  if bad ~= nil then
    return redis.error_reply("ERR tally: invalid " .. bad .. " of event " .. i)
  end
  evs[i] = e
end

-- A call sent again: what it did the first time.
if call > 0 then
  local memo = redis.call("GET", KEYS[replyKey])
  if memo then
    local c, n, at = string.match(memo, "^(%d+)|(%d+)|()")
    if c == num(call) then
      if tonumber(n) ~= nev then
        return redis.error_reply("ERR tally: invalid call: sent again with other events")
      end
      return cmsgpack.unpack(string.sub(memo, at))
    end
  end
end

if reseeding(KEYS[marker]) then
  return redis.error_reply("TALLYRESEEDING the shard's windows are being re-asserted")
end

local MAXGAPS = 64
local MAXMARKS = 10000

-- Read every key before the first write: one of the wrong type fails the
-- call here, with nothing written.
local prods = {}
for i = 1, np do
  local f = redis.call("HMGET", KEYS[i], "s", "c", "g")
  prods[i] = { i = i, s = tonumber(f[1]) or 0, c = tonumber(f[2]) or 0, g = tonumber(f[3]) or 0 }
end
local wins = {}
for i = np + 1, lastWin do
  wins[i] = load(KEYS[i], grace) or false
end
local function producer(i)
  return prods[i]
end

-- gaps loads p's gaps ({from, to} pairs) once, and the fields they were
-- stored in (p.orig), to delete them when they change.
local function gaps(p)
  if p.gaps == nil then
    p.gaps, p.orig = {}, {}
    if p.g > 0 then
      p.gaps = gaps_of(KEYS[p.i])
      for _, gp in ipairs(p.gaps) do
        table.insert(p.orig, "g:" .. num(gp[1]))
      end
    end
  end
  return p.gaps
end

-- unapplied reports whether p's event seq has not been applied yet.
local function unapplied(p, seq)
  if seq > p.s then
    return true
  end
  if p.g == 0 then
    return false
  end
  for _, gp in ipairs(gaps(p)) do
    if seq >= gp[1] and seq <= gp[2] then
      return true
    end
  end
  return false
end

-- mark records that p's event seq is applied.
local function mark(p, seq)
  p.dirty = true
  local gs
  if seq > p.s then
    if seq > p.s + 1 then
      gs = gaps(p)
      table.insert(gs, { p.s + 1, seq - 1 })
      if #gs > MAXGAPS then
        local oldest = 1
        for k = 2, #gs do
          if gs[k][1] < gs[oldest][1] then oldest = k end
        end
        table.remove(gs, oldest)
      end
      p.g, p.gapsDirty = #gs, true
    end
    p.s = seq
    return
  end
  gs = gaps(p)
  for k, gp in ipairs(gs) do
    if seq >= gp[1] and seq <= gp[2] then
      if gp[1] == gp[2] then
        table.remove(gs, k)
      elseif seq == gp[1] then
        gp[1] = seq + 1
      elseif seq == gp[2] then
        gp[2] = seq - 1
      else
        table.insert(gs, { seq + 1, gp[2] })
        gp[2] = seq - 1
      end
      break
    end
  end
  p.g, p.gapsDirty = #gs, true
end

local touched = {}
-- lingers: how long after its reset each window touched still counts
-- (its events' linger): its expiry when this call writes it whole.
local lingers = {}
-- held is what producer prod holds in window i (c:<producer>), read once,
-- with the events of the producer a reseed's re-assertion covers there
-- (v:<producer>, reseed.lua: from < seq <= to). opened marks the windows
-- this call opened: nothing is stored for them yet.
local held = {}
local opened = {}
local function holding(i, prod)
  local h = held[i]
  if h == nil then
    h = {}
    held[i] = h
  end
  if h[prod] == nil then
    if opened[i] then
      h[prod] = { n = 0, dirty = false }
    elseif wins[i] and wins[i].holder ~= nil then
      -- Compact: its holder's producer holds all of it, no reseed counted
      -- events in it.
      h[prod] = { n = held_by(KEYS[i], wins[i], names[prod]), dirty = false }
    else
      local f = redis.call("HMGET", KEYS[i], "c:" .. names[prod], "v:" .. names[prod])
      h[prod] = { n = tonumber(f[1]) or 0, dirty = false }
      if f[2] then
        local from, to = string.match(f[2], "^%x+:(%d+):(%d+)$")
        h[prod].from, h[prod].to = tonumber(from), tonumber(to)
      end
    end
  end
  return h[prod]
end
local function window(i)
  return wins[i] or nil
end

-- live reports whether the stored window w is the event's window and live
-- (a sliding window's sub-window: still in a span).
local function live(w, e)
  if e.reset > 0 then
    return w ~= nil and w.r == e.reset and w.r + e.linger > now
  end
  return place(w, e.start, now, e.len, tol, grace) == "live"
end

local function charge(e, p)
  if p.c > 0 then
    local mark = "n:" .. num(e.seq)
    if redis.call("HDEL", KEYS[e.prod], mark) == 1 then
      p.c = p.c - 1
      return 4, 0, 0, 0
    end
  end
  local w = window(e.win)
  if not live(w, e) then
    if e.reset > 0 then
      -- The window the response showed is not stored (the primary lost it,
      -- or it was collected): open it, unless it is over or replaced.
      if e.reset + e.linger <= now or e.reset - e.len > now + tol or (w ~= nil and w.r > now) then
        return 3, 0, 0, 0
      end
      local prev = now - grace
      if w ~= nil then prev = w.r end
      w = ending(e.reset, e.len, prev)
    else
      local state, prev, t = place(w, e.start, now, e.len, tol, grace)
      if state ~= "new" then
        return 3, 0, 0, 0
      end
      w = fresh(t, e.len, prev)
    end
    wins[e.win] = w
    held[e.win] = {} -- a new window: nobody holds anything in it yet
    opened[e.win] = true
  end
  w.u = w.u + e.units
  local h = holding(e.win, e.prod)
  h.n, h.dirty = h.n + e.units, true
  touched[e.win] = true
  lingers[e.win] = math.max(lingers[e.win] or 0, e.linger)
  return 1, w.u, w.r, e.units
end

local function giveback(e)
  if e.ref > 0 then
    local rp = producer(e.ref)
    if unapplied(rp, e.refseq) then
      if rp.c >= MAXMARKS then
        return 3, 0, 0, 0
      end
      redis.call("HSET", KEYS[e.ref], "n:" .. num(e.refseq), num(e.units))
      rp.c = rp.c + 1
      rp.dirty = true
      return 5, 0, 0, 0
    end
  end
  local w = window(e.win)
  if not live(w, e) then
    return 3, 0, 0, 0
  end
  local h = holding(e.win, e.prod)
  local amount = math.min(e.units, w.u, h.n)
  w.u = w.u - amount
  h.n, h.dirty = h.n - amount, true
  touched[e.win] = true
  lingers[e.win] = math.max(lingers[e.win] or 0, e.linger)
  return 1, w.u, w.r, amount
end

-- covered reports whether a reseed's re-assertion of the event's window
-- counted the event already (reseed.lua): it took effect then.
local function covered(e)
  local w = window(e.win)
  if e.reset == 0 or w == nil or w.r ~= e.reset or w.r + e.linger <= now then
    return false
  end
  local h = holding(e.win, e.prod)
  return h.from ~= nil and e.seq > h.from and e.seq <= h.to
end

local out = {}
for i = 1, nev do
  local e = evs[i]
  local p = producer(e.prod)
  local o, u, r, a = 2, 0, 0, 0
  if unapplied(p, e.seq) then
    if covered(e) then
      local w = window(e.win)
      o, u, r, a = 1, w.u, w.r, e.units
    elseif e.kind == "c" then
      o, u, r, a = charge(e, p)
    else
      o, u, r, a = giveback(e)
    end
    mark(p, e.seq)
  end
  local b = (i - 1) * 4
  out[b + 1], out[b + 2], out[b + 3], out[b + 4] = o, u, r, a
end

-- still_compact reports whether window i, compact when read, can stay so
-- after this call's events: its holder's producer still holds all of it,
-- and no other producer holds any.
local function still_compact(i)
  local w = wins[i]
  if w.holder == nil then
    return false
  end
  for prod, h in pairs(held[i] or {}) do
    if names[prod] == w.producer then
      if h.n ~= w.u then
        return false
      end
    elseif h.n ~= 0 then
      return false
    end
  end
  return true
end

for i in pairs(touched) do
  local w = wins[i]
  touch_span(KEYS[i], w.r)
  if still_compact(i) then
    -- One write, the expiry kept: what the holder was given stays as it
    -- was (w.mine), what its producer holds is the count.
    redis.call("SET", KEYS[i], encode(w.u, w.s, w.r, w.holder, w.p, grace, w.mine), "KEEPTTL")
  else
    expand(KEYS[i], w, grace + (lingers[i] or 0))
    save(KEYS[i], w, grace + (lingers[i] or 0))
    for prod, h in pairs(held[i] or {}) do
      if h.dirty then
        redis.call("HSET", KEYS[i], "c:" .. names[prod], num(h.n))
      end
    end
  end
end
for i, p in pairs(prods) do
  if p.dirty then
    local fields = { "s", num(p.s), "c", num(p.c), "g", num(p.g) }
    if p.gapsDirty then
      for _, f in ipairs(p.orig) do
        redis.call("HDEL", KEYS[i], f)
      end
      for _, gp in ipairs(p.gaps) do
        table.insert(fields, "g:" .. num(gp[1]))
        table.insert(fields, num(gp[2]))
      end
    end
    redis.call("HSET", KEYS[i], unpack(fields))
    redis.call("PEXPIRE", KEYS[i], num(ttl))
  end
end
if call > 0 then
  redis.call("SET", KEYS[replyKey], num(call) .. "|" .. num(nev) .. "|" .. cmsgpack.pack(out), "PX", num(replyTTL))
end
return out
