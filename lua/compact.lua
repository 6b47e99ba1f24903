-- compact.lua: arguments and the compact form of a window, shared by every
-- script that reads or writes windows (lua.go prepends it, before
-- window.lua where a script needs the rest of the model); never run on its
-- own. It is kept small, and first, because take.lua's cold path (a window
-- no one else holds) needs nothing else: each script call defines again
-- every function of what is prepended to it.
--
-- The compact form (window.lua has both forms): one string,
-- "<u>:<r>:<len>:<holder>", "<u>:<r>:<len>:<holder>:<back>" or
-- "<u>:<r>:<len>:<holder>:<back>:<given>" (<back> may be empty there).

-- Largest accepted millisecond timestamp or duration (year 5138; exact in a
-- Lua double).
local MAX_MS = 100000000000000
local MAX_UNITS = 1000000000

-- arg_int returns ARGV[i] as an integer in [lo, hi], or nil when it is not
-- made of 1 to 15 decimal digits or lies outside the range. digits: the
-- caller has found ARGV[i] made of digits only (digits_only), and it is not
-- looked at again.
local function arg_int(i, lo, hi, digits)
  local s = ARGV[i]
  local v = tonumber(s)
  if v == nil or v < lo or v > hi or type(s) ~= "string" or #s > 15 or (not digits and string.find(s, "%D")) then
    return nil
  end
  return v
end

-- digits_only reports whether ARGV[1] .. ARGV[n] are there and made of
-- decimal digits only: one look at them all, cheaper than one each.
local function digits_only(n)
  if #ARGV < n then
    return false
  end
  return not string.find(table.concat(ARGV, "", 1, n), "%D")
end

-- valid_producer reports whether s is a producer id: 1 to 64 of
-- [A-Za-z0-9_.-], dot-separated tokens none of which is empty (keys.go's
-- ValidProducer).
local function valid_producer(s)
  return type(s) == "string" and #s >= 1 and #s <= 64 and string.match(s, "^[%w_.-]+$") ~= nil
    and string.sub(s, 1, 1) ~= "." and string.sub(s, -1) ~= "." and string.find(s, "..", 1, true) == nil
end

-- num renders an integer-valued number without an exponent.
local function num(v)
  if v < 1e14 and v > -1e14 then
    return tostring(v)
  end
  return string.format("%.0f", v)
end

-- decode returns the compact window held in the string v (see above), with
-- p as its default when the string names none, or nil when v is not one.
-- w.holder is as stored: a caller that does not compare it with a valid
-- holder checks its form (holder_producer). w.mine is every unit ever
-- reserved for the holder in the window: <given>, or u when the string
-- names none; w.held, what the holder's producer holds, is u as read.
-- w.ulen is the length of u's digits in v.
local function decode(v, grace)
  local u, r, len, holder, tail = string.match(v, "^(%d+):(%d+):(%d+):([%w_.-]+)(.*)$")
  if u == nil or #u > 10 or #r > 11 or #len > 9 then
    return nil
  end
  local back, given = "", ""
  if tail ~= "" then
    back = string.match(tail, "^:(%d+)$")
    if back == nil then
      back, given = string.match(tail, "^:(%d*):(%d+)$")
      if back == nil or #given > 15 then
        return nil
      end
    end
    if #back > 11 then
      return nil
    end
  end
  r = tonumber(r) * 1000
  local s = r - tonumber(len) * 1000
  local p = s + 1000 - grace
  if back ~= "" then
    p = s - tonumber(back) * 1000
  end
  local n = tonumber(u)
  local mine = n
  if given ~= "" then
    mine = tonumber(given)
  end
  return { u = n, s = s, r = r, p = p, holder = holder, mine = mine, held = n, ulen = #u }
end

-- holder_producer returns the producer of a compact window's stored holder
-- (<producer>.<n>), or nil when the holder has no such form: the string is
-- then no window.
local function holder_producer(holder)
  return string.match(holder, "^(.+)%.[%w_-]+$")
end

-- compact_holder reports whether holder, reserving for producer, can hold a
-- compact window: <producer>.<n>, n of [A-Za-z0-9_-].
local function compact_holder(holder, producer)
  return string.sub(holder, 1, #producer + 1) == producer .. "."
    and string.match(string.sub(holder, #producer + 2), "^[%w_-]+$") ~= nil
end

-- encode renders a compact window: u units, all the holder's producer's,
-- from s to r (ms, whole seconds), accepting starts back to p; mine, every
-- unit ever reserved for the holder, is written only when it is not u.
local function encode(u, s, r, holder, p, grace, mine)
  local v = num(u) .. ":" .. num(r / 1000) .. ":" .. num((r - s) / 1000) .. ":" .. holder
  local back = ""
  if p ~= s + 1000 - grace then
    back = num(math.max(0, math.ceil((s - p) / 1000)))
  end
  if mine ~= nil and mine ~= u then
    return v .. ":" .. back .. ":" .. num(mine)
  end
  if back ~= "" then
    v = v .. ":" .. back
  end
  return v
end

-- opening returns the start of the window a request at t opens when its
-- caller names none: the whole second t falls in, so that the window lasts
-- exactly its length (a window of one second holds one second of requests,
-- as a clock-aligned one does) and its reset, s + len, is a whole second;
-- or, for a window aligned to the clock (align), the multiple of its length
-- since the Unix epoch that t falls in (envoyproxy/ratelimit's windows).
-- Windows of the calendar (a day, a week, a month, a year of a time zone)
-- have no fixed length: the caller names them, take.lua by their start and
-- reset, apply.lua by the reset each event names and the length of that
-- window (window.lua's ending).
local function opening(t, len, align)
  if align then
    return t - t % len
  end
  return t - t % 1000
end

-- first_p returns the earliest event start a first window, from s, accepts
-- (p): later than any start whose window could have been garbage collected
-- before a request at any time of s's second.
local function first_p(s, grace)
  return s + 1000 - grace
end
