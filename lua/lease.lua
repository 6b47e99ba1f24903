-- lease.lua: hold, renew or give up the lease that makes one accountant the
-- active one for a shard. The lease only avoids duplicate work: exactly-once
-- comes from apply.lua, so two holders at once are harmless.
-- Runs on: the shard primary.
--
-- KEYS[1] -> the lease key (keys.go)
-- ARGV[1] -> "hold" (take the lease if it is free or already ours, and extend
--            it) or "free" (give it up if it is ours)
-- ARGV[2] -> owner: 1 to 64 of [A-Za-z0-9_.-], unique per accountant process
-- ARGV[3] -> lifetime, ms (100 .. 1e9); ignored by "free"
--
-- Returns: 1 when the caller holds the lease after "hold" (or gave it up
-- after "free"), 0 when another owner holds it (nothing changed).
-- Errors: "ERR tally: invalid <argument>"; nothing is written then.
local op = ARGV[1]
if op ~= "hold" and op ~= "free" then return redis.error_reply("ERR tally: invalid lease op") end
local owner = ARGV[2]
if type(owner) ~= "string" or #owner < 1 or #owner > 64 or not string.match(owner, "^[%w_.-]+$") then
  return redis.error_reply("ERR tally: invalid owner")
end
local ttl = tonumber(ARGV[3])
if op == "hold" and (type(ARGV[3]) ~= "string" or not string.match(ARGV[3], "^%d+$") or ttl < 100 or ttl > 1000000000) then
  return redis.error_reply("ERR tally: invalid lifetime")
end
local cur = redis.call("GET", KEYS[1])
if op == "free" then
  if cur == owner then
    redis.call("DEL", KEYS[1])
    return 1
  end
  return 0
end
if cur and cur ~= owner then
  return 0
end
redis.call("SET", KEYS[1], owner, "PX", ttl)
return 1
