// Cost growth of thaw-scaler with the number of ScaledObjects: 10, 1 000 and
// 10 000 (distinct models), each against a real redis-server and a real
// prometheus.
//
//   node bench/scaler_cost.mjs
//
// For each size a fresh thaw-scaler (Redis and Prometheus intervals both 1 s)
// learns n ScaledObjects through GetMetricSpec and IsActive calls (grpc-js),
// is checked to answer GetMetrics with the replicas its inputs imply for a
// sample of models, then is left alone for a measurement window (10 s) in
// which we take: resident memory, CPU time (utime+stime from /proc/PID/stat,
// and the finer schedstat run time) per Redis interval, and round trips to
// Prometheus and Redis per interval from its /metrics counters. Round trips
// per interval must not grow with n: the benchmark fails (exit 1) if they do,
// or if anything cannot run or answers wrongly.
//
// The inputs are real: an exporter in this process serves
// vllm:generation_tokens_total for every model of every size (label
// bench_size), Prometheus scrapes it every second, and the scaler's token-rate
// query selects the size under test (so Prometheus answers n series); Redis
// holds a list thaw:queue:m<i> with a length depending on i.
//
// Environment:
//   THAW_BUILD_DIR   build directory (default <repo>/build-bench)
//   BENCH_SIZES      comma-separated model counts (default 10,1000,10000)
//   BENCH_WINDOW_S   measurement window in seconds (default 10)
//   BENCH_SCRAPES    fetches of /metrics and /models per size for the
//                    event-loop stall measurement (default 3)

import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { promisify } from 'node:util';

import {
  repoRoot, spawnProcess, startRedis, startPrometheus, grpcClient, waitUntil,
} from '../test/integration/lib/harness.mjs';
import { connectRedis } from './lib/resp.mjs';

const buildDir = path.resolve(process.env.THAW_BUILD_DIR || path.join(repoRoot, 'build-bench'));
const scalerBin = path.join(buildDir, 'scaler', 'thaw-scaler');
const SIZES = (process.env.BENCH_SIZES ?? '10,1000,10000').split(',').map(Number);
const WINDOW_MS = Number(process.env.BENCH_WINDOW_S ?? 10) * 1000;
const REGISTER_CONCURRENCY = 64;
// Scrapes of /metrics and of /models per size for the stall measurement.
const SCRAPES = Number(process.env.BENCH_SCRAPES ?? 3);
const execFileAsync = promisify(execFile);
// Round trips per interval may differ a little between sizes only because the
// window's edges cut intervals differently; more than this is growth.
const RT_TOLERANCE = 1.25;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (s) => process.stderr.write(`scaler_cost: ${s}\n`);

// Model i: token rate 500, 1500, 2500 or 3500/s (1..4 replicas at the default
// 1000 tokens/s per replica, never near a boundary); queue length 45 for every
// fifth model (5 replicas at 10 per replica), else 0..2 (0 or 1 replica).
const tokenRate = (i) => 1000 * (i % 4) + 500;
const queueLen = (i) => (i % 5 === 0 ? 45 : i % 3);
const expectedReplicas = (i) => Math.max(Math.ceil(tokenRate(i) / 1000), Math.ceil(queueLen(i) / 10));

function startExporter(sizes) {
  const t0 = Date.now();
  const maxN = Math.max(...sizes);
  const server = http.createServer((req, res) => {
    const t = (Date.now() - t0) / 1000;
    const lines = ['# TYPE vllm:generation_tokens_total counter'];
    for (const n of sizes) {
      for (let i = 0; i < n; i++) {
        lines.push(`vllm:generation_tokens_total{model_name="m${i}",bench_size="${n}"} ${(tokenRate(i) * t).toFixed(3)}`);
      }
    }
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
    res.end(`${lines.join('\n')}\n`);
  });
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => resolve({ server, port: server.address().port, maxN }));
  });
}

async function fillQueues(redisPort, n) {
  const r = await connectRedis(redisPort);
  try {
    const cmds = [];
    for (let i = 0; i < n; i++) {
      const len = queueLen(i);
      if (len > 0) cmds.push(['RPUSH', `thaw:queue:m${i}`, ...Array.from({ length: len }, (_, k) => `job${k}`)]);
    }
    for (let k = 0; k < cmds.length; k += 2000) await r.pipeline(cmds.slice(k, k + 2000));
  } finally {
    r.close();
  }
}

async function scrape(httpPort) {
  const res = await fetch(`http://127.0.0.1:${httpPort}/metrics`);
  if (res.status !== 200) throw new Error(`/metrics: HTTP ${res.status}`);
  const text = await res.text();
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line.startsWith('thaw_scaler_source_') && !line.startsWith('thaw_scaler_redis_') &&
        !line.startsWith('thaw_scaler_targets') && !line.startsWith('process_resident_memory_bytes')) continue;
    const sp = line.lastIndexOf(' ');
    m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  const get = (k) => {
    if (!m.has(k)) throw new Error(`/metrics has no ${k}`);
    return m.get(k);
  };
  return {
    bytes: text.length,
    targets: get('thaw_scaler_targets'),
    rss: get('process_resident_memory_bytes'),
    rtRedis: get('thaw_scaler_source_round_trips_total{service="redis"}'),
    rtProm: get('thaw_scaler_source_round_trips_total{service="prometheus"}'),
    redisCmds: get('thaw_scaler_redis_commands_total'),
    redisQueueDone: get('thaw_scaler_source_updates_total{source="redis_queue"}') +
      get('thaw_scaler_source_errors_total{source="redis_queue"}'),
    redisErrors: get('thaw_scaler_source_errors_total{source="redis_queue"}') +
      get('thaw_scaler_source_errors_total{source="redis_held"}'),
    promDone: get('thaw_scaler_source_updates_total{source="prometheus"}') +
      get('thaw_scaler_source_errors_total{source="prometheus"}'),
    promUpdates: get('thaw_scaler_source_updates_total{source="prometheus"}'),
    promErrors: get('thaw_scaler_source_errors_total{source="prometheus"}'),
  };
}

const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100;

function procCpu(pid) {
  // Fields after the parenthesised command name; utime and stime are the
  // 14th and 15th fields of the whole line.
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(f[11]) + Number(f[12]);
  let runNs = 0;
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    try {
      runNs += Number(fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch { /* thread gone */ }
  }
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
  const threads = Number(/Threads:\s+(\d+)/.exec(status)?.[1] ?? NaN);
  return { ticks, runNs, rssKiB, threads };
}

// What one fetch of `route` costs the scaler, and how long its event loop
// stops answering meanwhile. curl (a child process, so this process's own
// loop stays free to time calls) fetches the page: once alone, for the
// scaler's CPU time, then again while one grpc-js client sends GetMetrics
// back to back; the slowest call during that fetch is the stall the page
// causes (the same loop serves gRPC, KEDA's pushes and the sources).
// Baseline: the same calls for as long with no fetch.
async function scrapeStall(httpPort, client, pid, route) {
  const ref = { scaledObjectRef: refOf(1), metricName: 'm1' };
  const callsWhile = async (more) => {
    const lat = [];
    while (more()) {
      const t = performance.now();
      await client.getMetrics(ref);
      lat.push(performance.now() - t);
    }
    return lat;
  };
  const fetchPage = async () => {
    const { stdout } = await execFileAsync('curl', ['-sS', '-o', '/dev/null', '-w', '%{http_code} %{size_download}',
      '--max-time', '30', `http://127.0.0.1:${httpPort}${route}`]);
    const [code, bytes] = stdout.trim().split(' ').map(Number);
    if (code !== 200) throw new Error(`${route}: HTTP ${code}`);
    return bytes;
  };
  const runs = [];
  for (let k = 0; k < SCRAPES; k++) {
    const cpu0 = procCpu(pid);
    const t0 = performance.now();
    const bytes = await fetchPage();
    const wallMs = performance.now() - t0;
    const cpuMs = (procCpu(pid).runNs - cpu0.runNs) / 1e6;
    await sleep(200);
    let fetching = true;
    const fetched = fetchPage().finally(() => { fetching = false; });
    const lat = await callsWhile(() => fetching);
    await fetched;
    await sleep(200);
    const tb = performance.now();
    const base = await callsWhile(() => performance.now() - tb < wallMs);
    runs.push({ wallMs, cpuMs, bytes, maxMs: Math.max(0, ...lat), calls: lat.length, baseMaxMs: Math.max(0, ...base) });
    await sleep(200);
  }
  const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return {
    route,
    wallMs: med(runs.map((r) => r.wallMs)),
    cpuMs: med(runs.map((r) => r.cpuMs)),
    kib: runs[0].bytes / 1024,
    stallMs: med(runs.map((r) => r.maxMs)),
    stallMaxMs: Math.max(...runs.map((r) => r.maxMs)),
    baseStallMs: med(runs.map((r) => r.baseMaxMs)),
    baseStallMaxMs: Math.max(...runs.map((r) => r.baseMaxMs)),
    calls: runs.reduce((a, r) => a + r.calls, 0),
  };
}

async function pool(n, concurrency, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(concurrency, n) }, async () => {
    while (next < n) {
      const i = next++;
      await fn(i);
    }
  }));
}

// Policy v1: the check below expects its plain arithmetic (max(ceil(rate /
// target), ceil(queue / target)) at once); v2 waits for a queue to persist.
// The cost measured is the scaler's bookkeeping, the same for both.
const refOf = (i) => ({
  name: `so-${i}`,
  namespace: 'bench',
  scalerMetadata: { model: `m${i}`, targetTokensPerSecond: '1000', targetQueueLength: '10', policy: 'v1' },
});

async function measureSize(n, redis, prom) {
  const query = `sum by (model_name) (rate(vllm:generation_tokens_total{bench_size="${n}"}[4s]))`;
  const scaler = await spawnProcess(scalerBin, [
    '--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--redis-url', redis.url, '--prometheus-url', prom.url,
    '--prometheus-interval-ms', '1000', '--redis-interval-ms', '1000',
    '--token-rate-query', query,
  ], { name: `thaw-scaler(n=${n})`, readyLogRegex: /event=listening grpc_port=\d+ http_port=\d+/ });
  try {
    const m = await scaler.waitForLog(/event=listening grpc_port=(\d+) http_port=(\d+)/);
    const grpcPort = Number(m[1]);
    const httpPort = Number(m[2]);
    const idle = procCpu(scaler.pid);

    const client = grpcClient(`127.0.0.1:${grpcPort}`, { deadlineMs: 20000 });
    const t0 = performance.now();
    try {
      await pool(n, REGISTER_CONCURRENCY, async (i) => {
        const spec = await client.getMetricSpec(refOf(i));
        if (spec.metricSpecs?.[0]?.targetSize !== 1) throw new Error(`GetMetricSpec m${i}: ${JSON.stringify(spec)}`);
        await client.isActive(refOf(i));
      });
    } catch (e) {
      throw new Error(`registering ${n} ScaledObjects: ${e.code ?? ''} ${e.details ?? e.message}`, { cause: e });
    }
    const registerS = (performance.now() - t0) / 1000;

    let s = await scrape(httpPort);
    if (s.targets !== n) throw new Error(`thaw_scaler_targets is ${s.targets}, expected ${n}`);
    // Two full intervals of each source after the last registration, so every
    // batch in the window covers all n models.
    // (/metrics is ~900 bytes per model: poll it sparingly.)
    const base = s;
    await sleep(2200);
    await waitUntil(async () => {
      s = await scrape(httpPort);
      return s.promUpdates >= base.promUpdates + 2 && s.redisQueueDone >= base.redisQueueDone + 2;
    }, 20000, { intervalMs: 1000, what: `two Prometheus and Redis intervals with ${n} models` });

    const sample = [...new Set([0, 1, 2, 3, 4, 5, 6, 7, Math.floor(n / 2), n - 1].filter((i) => i < n))];
    for (const i of sample) {
      const res = await client.getMetrics({ scaledObjectRef: refOf(i), metricName: `m${i}` });
      const got = res.metricValues?.[0]?.metricValue;
      if (got !== expectedReplicas(i)) {
        throw new Error(`GetMetrics m${i} (n=${n}): ${got} replicas, expected ${expectedReplicas(i)} ` +
          `(token rate ${tokenRate(i)}/s, queue ${queueLen(i)})`);
      }
    }
    // The window: /proc read right after /metrics at the start and right
    // before it at the end, so serving those two scrapes is left out.
    log(`n=${n}: measuring for ${WINDOW_MS / 1000} s, scaler pid ${scaler.pid}`);
    const a = await scrape(httpPort);
    const ca = procCpu(scaler.pid);
    const ta = performance.now();
    await sleep(WINDOW_MS);
    const cb = procCpu(scaler.pid);
    const tb = performance.now();
    const b = await scrape(httpPort);
    const scrapes = [];
    for (const route of ['/metrics', '/models']) scrapes.push(await scrapeStall(httpPort, client, scaler.pid, route));
    client.close();

    const redisIntervals = b.redisQueueDone - a.redisQueueDone;
    const promIntervals = b.promDone - a.promDone;
    if (redisIntervals <= 0 || promIntervals <= 0) {
      throw new Error(`n=${n}: ${redisIntervals} Redis and ${promIntervals} Prometheus intervals in the window`);
    }
    if (b.redisErrors !== a.redisErrors || b.promErrors !== a.promErrors) {
      throw new Error(`n=${n}: source errors during the window (redis ${b.redisErrors - a.redisErrors}, ` +
        `prometheus ${b.promErrors - a.promErrors}); scaler log:\n${scaler.output().split('\n').slice(-20).join('\n')}`);
    }
    const row = {
      n,
      targets: b.targets,
      registerS,
      windowS: (tb - ta) / 1000,
      rssKiB: cb.rssKiB,
      rssIdleKiB: idle.rssKiB,
      threads: cb.threads,
      redisIntervals,
      promIntervals,
      cpuMsStat: ((cb.ticks - ca.ticks) * 1000 / CLK_TCK) / redisIntervals,
      cpuMsSched: ((cb.runNs - ca.runNs) / 1e6) / redisIntervals,
      cpuPct: ((cb.runNs - ca.runNs) / 1e6) / (tb - ta) * 100,
      rtRedis: (b.rtRedis - a.rtRedis) / redisIntervals,
      cmdsRedis: (b.redisCmds - a.redisCmds) / redisIntervals,
      rtProm: (b.rtProm - a.rtProm) / promIntervals,
      metricsBytes: b.bytes,
      scrapes,
    };
    const code = await scaler.stop('SIGTERM', 10000);
    if (code !== 0) throw new Error(`thaw-scaler (n=${n}) exited ${code} on SIGTERM`);
    return row;
  } finally {
    if (scaler.exitCode === null) await scaler.kill();
  }
}

async function main() {
  if (!fs.existsSync(scalerBin)) {
    throw new Error(`${scalerBin} not built: meson setup build-bench --buildtype=release && meson compile -C build-bench`);
  }
  if (SIZES.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('BENCH_SIZES: positive integers, comma-separated');
  const exporter = await startExporter(SIZES);
  const redis = await startRedis();
  const prom = await startPrometheus({ scrapeTargets: [`127.0.0.1:${exporter.port}`], scrapeInterval: '1s' });
  const rows = [];
  try {
    await fillQueues(redis.port, exporter.maxN);
    const biggest = exporter.maxN;
    await prom.waitForSeries(`count(rate(vllm:generation_tokens_total{bench_size="${biggest}"}[4s]))`,
      (r) => r.length === 1 && Number(r[0].value[1]) === biggest, 30000);
    for (const n of SIZES) {
      log(`n=${n}...`);
      rows.push(await measureSize(n, redis, prom));
    }
  } finally {
    await prom.stop().catch(() => {});
    await redis.stop().catch(() => {});
    exporter.server.close();
  }

  const cpuModel = /model name\s*:\s*(.*)/.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? '?';
  const os = /PRETTY_NAME="?([^"\n]*)/.exec(fs.readFileSync('/etc/os-release', 'utf8'))?.[1] ?? '?';
  const out = [];
  out.push('thaw-scaler cost by number of ScaledObjects (Redis and Prometheus intervals 1 s)');
  out.push(`date: ${new Date().toISOString().replace(/\.\d+Z$/, 'Z')}  host: ${execFileSync('nproc').toString().trim()} cores, ${cpuModel}, ${os}`);
  out.push(`binary: ${scalerBin}; window ${WINDOW_MS / 1000} s per size; CLK_TCK ${CLK_TCK}; load average now ${fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}`);
  out.push('correctness: thaw_scaler_targets = n, and GetMetrics replicas = expected for a sample of models incl. the last, per size');
  out.push('');
  const hdr = ['models', 'RSS_KiB', 'RSS_idle_KiB', 'cpu_ms/int(stat)', 'cpu_ms/int(sched)', 'cpu_%',
    'redis_rt/int', 'redis_cmds/int', 'prom_rt/int', 'intervals(r/p)', 'register_s', 'metrics_KiB'];
  const fmt = (cols) => cols.map((c, k) => String(c).padStart(k === 0 ? 6 : hdr[k].length + 1)).join(' ');
  out.push(fmt(hdr));
  for (const r of rows) {
    out.push(fmt([r.n, r.rssKiB, r.rssIdleKiB, r.cpuMsStat.toFixed(2), r.cpuMsSched.toFixed(3), r.cpuPct.toFixed(2),
      r.rtRedis.toFixed(2), r.cmdsRedis.toFixed(2), r.rtProm.toFixed(2), `${r.redisIntervals}/${r.promIntervals}`,
      r.registerS.toFixed(2), (r.metricsBytes / 1024).toFixed(0)]));
  }
  out.push('');
  const shdr = ['models', 'page', 'KiB', 'fetch_ms', 'scaler_cpu_ms', 'slowest_GetMetrics_ms(fetching)', 'slowest_GetMetrics_ms(not)', 'calls'];
  out.push(shdr.map((c, k) => String(c).padStart(k === 0 ? 6 : c.length + 1)).join(' '));
  for (const r of rows) {
    for (const sc of r.scrapes) {
      const cols = [r.n, sc.route, sc.kib.toFixed(0), sc.wallMs.toFixed(1), sc.cpuMs.toFixed(1),
        `${sc.stallMs.toFixed(1)} (max ${sc.stallMaxMs.toFixed(1)})`,
        `${sc.baseStallMs.toFixed(1)} (max ${sc.baseStallMaxMs.toFixed(1)})`, sc.calls];
      out.push(cols.map((c, k) => String(c).padStart(k === 0 ? 6 : shdr[k].length + 1)).join(' '));
    }
  }
  out.push(`(${SCRAPES} fetches of each page per size by curl, alone: fetch time and scaler CPU, medians; then ${SCRAPES} more with GetMetrics sent back to back meanwhile: the slowest call per fetch, median and max, against the slowest call sent back to back for as long with no fetch)`);
  out.push('');
  out.push('redis_rt = batches (queue lengths + held counts), each pipelined in one go; redis_cmds = EVALSHA calls (one per 1000 keys);');
  out.push('cpu_ms/int = scaler CPU time per Redis interval (stat: utime+stime at 1/CLK_TCK resolution; sched: /proc/PID/task/*/schedstat run time).');

  const base = rows[0];
  const grew = rows.filter((r) => r.rtRedis > base.rtRedis * RT_TOLERANCE || r.rtProm > base.rtProm * RT_TOLERANCE);
  process.stdout.write(`${out.join('\n')}\n`);
  if (rows.length < 2) {
    // One size has nothing to compare with: say so, not "constant".
    process.stdout.write(`RESULT: not checked: the round trips per interval need two sizes or more to compare (Redis ${rows.map((r) => r.rtRedis.toFixed(2)).join(' / ')}, Prometheus ${rows.map((r) => r.rtProm.toFixed(2)).join(' / ')})\n`);
  } else if (grew.length) {
    process.stdout.write(`RESULT: FAILED: round trips per interval grow with the model count at n=${grew.map((r) => r.n).join(', ')}\n`);
    process.exitCode = 1;
  } else {
    process.stdout.write(`RESULT: round trips per interval constant in the model count (Redis ${rows.map((r) => r.rtRedis.toFixed(2)).join(' / ')}, Prometheus ${rows.map((r) => r.rtProm.toFixed(2)).join(' / ')})\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`scaler_cost: FAILED: ${e.stack ?? e.message}\n`);
  process.exit(1);
}).then(() => process.exit(process.exitCode ?? 0));
