-- wrk script: GET <QUERY_PATH>?<PARAM>=<random 1..MAX_ID> with an X-API-Key header, and at the end one line
--   WRKJSON {...}
-- with exact latency percentiles (microseconds) and the error counts; wrk's own text rounds them.
-- Settings come from the environment (loadtests/wrk.py sets them):
--   API_KEY     the key sent as X-API-Key (empty: no header)
--   QUERY_PATH  default /q/account
--   PARAM       default aid
--   MAX_ID      default 1000000 (keys are drawn uniformly from 1..MAX_ID)
local api_key = os.getenv("API_KEY") or ""
local query_path = os.getenv("QUERY_PATH") or "/q/account"
local param = os.getenv("PARAM") or "aid"
local max_id = tonumber(os.getenv("MAX_ID") or "1000000")

local thread_counter = 0

function setup(thread)
  thread_counter = thread_counter + 1
  thread:set("thread_id", thread_counter)
end

function init(args)
  -- a different sequence per thread and per run
  math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + math.floor(os.clock() * 1e6))
  if api_key ~= "" then
    wrk.headers["X-API-Key"] = api_key
  end
  sep = string.find(query_path, "?", 1, true) and "&" or "?"
end

function request()
  return wrk.format("GET", query_path .. sep .. param .. "=" .. math.random(1, max_id))
end

function done(summary, latency, requests)
  local p = {}
  for _, q in ipairs({50, 90, 99, 99.9}) do
    p[#p + 1] = string.format('"%s": %d', tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "max": %d, "mean": %.1f, "stdev": %.1f, %s}}\n',
    summary.requests, summary.duration, summary.bytes,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status,
    summary.errors.timeout,
    latency.min, latency.max, latency.mean, latency.stdev, table.concat(p, ", ")))
end
