-- wrk script for the /health floor: a fixed GET (the URL's path), and at the end the same WRKJSON line as
-- random_aid.lua (exact percentiles in microseconds, error counts).
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
