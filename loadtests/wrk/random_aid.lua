-- wrk script: GET <QUERY_PATH>?<PARAM>=<random 1..MAX_ID> with an X-API-Key header, and at the end one line
--   WRKJSON {...}
-- with exact latency percentiles (microseconds) and the error counts; wrk's own text rounds them.
-- Settings come from the environment (loadtests/wrk.py sets them):
--   API_KEY     the key sent as X-API-Key (empty: no header)
--   QUERY_PATH  default /q/account
--   PARAM       default aid
--   MAX_ID      default 1000000 (keys are drawn uniformly from 1..MAX_ID)
--   CHECK_BODY  "account" (default): every 200 body must hold exactly one row of the account asked for:
--               its aid was asked for by this thread and not yet answered (so no answer is another call's,
--               repeated, or invented) and its bid is the one pgbench's layout gives it, (aid-1)/100000+1;
--               "off": bodies are not read (another query, or a pure throughput floor)
--   KEYS_FILE   a file of API key secrets, one a line: each call takes one of the first KEYS_USED (default all)
--               at random instead of API_KEY (many keys, each with its own limits: the limits block)
--   HOT_KEYS    N > 0 (with KEYS_FILE): the first N keys are the hot set, drawn with probability HOT_SHARE
--   HOT_SHARE   (default 0.5); the other keys share the rest evenly (the limits block's skewed mix: the
--               hottest 1% of 10,000 keys make half the calls). Unset: every key is equally likely.
--   LATENCY_HISTOGRAM  "1": also one line WRKHIST {"us": [[value, count], ...]}, every latency wrk recorded
--               (its histogram has 1 us buckets), so runs can be pooled into one distribution; keep it to
--               low connection counts (wrk walks its histogram once per distinct value)
--   CLIENT_IPS  N > 0: each call comes "from" one of N addresses at random (X-Forwarded-For 10.x.y.z; the
--               gateway must trust one proxy hop)
-- Statuses are counted as "200", "429" and "other" (the limits block judges refusals by them).
-- Wrong bodies are counted as "bad_body" (the row does not match) and "unasked" (an answer for an aid this
-- thread has no call out for); both must be 0 in a result.
local api_key = os.getenv("API_KEY") or ""
local query_path = os.getenv("QUERY_PATH") or "/q/account"
local param = os.getenv("PARAM") or "aid"
local max_id = tonumber(os.getenv("MAX_ID") or "1000000")
local check_body = (os.getenv("CHECK_BODY") or "account") ~= "off"
local accounts_per_branch = 100000
local client_ips = tonumber(os.getenv("CLIENT_IPS") or "0")
local hot_keys = tonumber(os.getenv("HOT_KEYS") or "0")
local hot_share = tonumber(os.getenv("HOT_SHARE") or "0.5")
local latency_histogram = os.getenv("LATENCY_HISTOGRAM") == "1"
local keys = {}
local keys_file = os.getenv("KEYS_FILE") or ""
if keys_file ~= "" then
  local used = tonumber(os.getenv("KEYS_USED") or "0")
  for line in io.lines(keys_file) do
    if line ~= "" and (used == 0 or #keys < used) then keys[#keys + 1] = line end
  end
end

local thread_counter = 0

function init(args)
  -- a different sequence per thread and per run
  math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + math.floor(os.clock() * 1e6))
  if api_key ~= "" then
    wrk.headers["X-API-Key"] = api_key
  end
  sep = string.find(query_path, "?", 1, true) and "&" or "?"
end

-- Calls out, per aid (a thread's connections each have one call out: keep-alive, no pipelining).
-- The counters are globals: done() reads them from each thread's own Lua state (thread:get).
local outstanding = {}
bad_body = 0
unasked = 0
checked = 0
ok = 0
limited = 0
other = 0

local headers = {}

-- Which key a call takes: evenly over all of them, or with HOT_KEYS, the hot set with probability HOT_SHARE
-- (evenly within it) and else one of the others (evenly).
local function draw_key()
  if hot_keys > 0 and hot_keys < #keys then
    if math.random() < hot_share then
      return math.random(1, hot_keys)
    end
    return math.random(hot_keys + 1, #keys)
  end
  return math.random(1, #keys)
end

function request()
  local aid = math.random(1, max_id)
  if check_body then
    outstanding[aid] = (outstanding[aid] or 0) + 1
  end
  if #keys == 0 and client_ips == 0 then
    return wrk.format("GET", query_path .. sep .. param .. "=" .. aid)
  end
  if #keys > 0 then
    headers["X-API-Key"] = keys[draw_key()]
  end
  if client_ips > 0 then
    local n = math.random(0, client_ips - 1)
    headers["X-Forwarded-For"] = "10." .. math.floor(n / 65536) .. "." .. math.floor(n / 256) % 256 .. "." .. n % 256
  end
  return wrk.format("GET", query_path .. sep .. param .. "=" .. aid, headers)
end

local function count(status)
  if status == 200 then ok = ok + 1 elseif status == 429 then limited = limited + 1 else other = other + 1 end
end

if not check_body then
  function response(status, headers, body)
    count(status)
  end
else
  function response(status, headers, body)
    count(status)
    if status ~= 200 then
      return   -- counted by wrk as a status error; its call stays out (the aid is unknown)
    end
    checked = checked + 1
    local aid = tonumber(string.match(body, '"aid"%s*:%s*(%d+)'))
    local bid = tonumber(string.match(body, '"bid"%s*:%s*(%d+)'))
    local _, rows = string.gsub(body, '"aid"%s*:', "")
    if aid == nil or rows ~= 1 or bid ~= math.floor((aid - 1) / accounts_per_branch) + 1 then
      bad_body = bad_body + 1
      return
    end
    local out = outstanding[aid]
    if out == nil then
      unasked = unasked + 1
    elseif out == 1 then
      outstanding[aid] = nil
    else
      outstanding[aid] = out - 1
    end
  end
end

local threads = {}

function setup(thread)
  thread_counter = thread_counter + 1
  thread:set("thread_id", thread_counter)
  threads[#threads + 1] = thread
end

function done(summary, latency, requests)
  local bad, stray, seen, n200, n429, nother = 0, 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    bad = bad + (t:get("bad_body") or 0)
    stray = stray + (t:get("unasked") or 0)
    seen = seen + (t:get("checked") or 0)
    n200 = n200 + (t:get("ok") or 0)
    n429 = n429 + (t:get("limited") or 0)
    nother = nother + (t:get("other") or 0)
  end
  local p = {}
  for _, q in ipairs({50, 90, 99, 99.9}) do
    p[#p + 1] = string.format('"%s": %d', tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"bodies": {"checked": %d, "bad_body": %d, "unasked": %d, "check": "%s"}, ' ..
    '"statuses": {"200": %d, "429": %d, "other": %d}, ' ..
    '"latency_us": {"min": %d, "max": %d, "mean": %.1f, "stdev": %.1f, %s}}\n',
    summary.requests, summary.duration, summary.bytes,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status,
    summary.errors.timeout, seen, bad, stray, check_body and "account" or "off", n200, n429, nother,
    latency.min, latency.max, latency.mean, latency.stdev, table.concat(p, ", ")))
  if latency_histogram then
    local pairs_out = {}
    for i = 1, #latency do
      local value, count = latency(i)
      pairs_out[#pairs_out + 1] = string.format("[%d, %d]", value, count)
    end
    io.write('WRKHIST {"us": [' .. table.concat(pairs_out, ", ") .. ']}\n')
  end
end
