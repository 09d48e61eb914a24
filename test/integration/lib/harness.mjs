// Integration-test harness shared by every Node test in test/integration.
//
// Real peers only: redis-server and prometheus from Debian, the project's own
// binaries from the build directory, and gRPC clients built with grpc-js from
// the repository's .proto files. Every process started here is registered and
// killed when the test file ends (node:test after() hook) and, as a last
// resort, in a process 'exit' hook, so a failing test leaves nothing listening.
//
// gRPC messages use proto-loader with keepCase: true, so field names are
// exactly those of the .proto files, which are camelCase already:
// scaledObjectRef.scalerMetadata, metricValues[].metricValueFloat,
// metricSpecs[].targetSizeFloat. int64 fields come back as JS numbers, enums
// as strings ('SERVING'), and unset fields with their defaults
// (IsActiveResponse.result is false, never undefined).
//
// Environment:
//   THAW_BUILD_DIR      build directory (default <repo>/build)
//   THAW_TEST_VERBOSE=1 echo every child's output to stderr as it arrives
//   THAW_KEEP_TMP=1     keep temporary directories after the run
//   THAW_TEST_WRAPPER   command prefix (e.g. "valgrind --error-exitcode=25")
//                       applied to binaries under the build directory only

import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import readline from 'node:readline';
import { after } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

/** Absolute path of the repository root. */
export const repoRoot = path.resolve(here, '..', '..', '..');
/** Absolute path of the meson build directory under test. */
export const buildDir = path.resolve(process.env.THAW_BUILD_DIR || path.join(repoRoot, 'build'));

export const REDIS_SERVER = '/usr/bin/redis-server';
export const REDIS_CLI = '/usr/bin/redis-cli';
export const PROMETHEUS = '/usr/bin/prometheus';

const BINARIES = {
  'thaw-scaler': ['scaler', 'thaw-scaler'],
  'thaw-activator': ['activator', 'thaw-activator'],
  'thaw-fake-vllm': ['test', 'fakevllm', 'thaw-fake-vllm'],
};

/**
 * Path of a project binary in the build directory: 'thaw-scaler',
 * 'thaw-activator' or 'thaw-fake-vllm' (the 'thaw-' prefix may be left off).
 */
export function binPath(name) {
  const key = name.startsWith('thaw-') ? name : `thaw-${name}`;
  const parts = BINARIES[key];
  if (!parts) throw new Error(`binPath: unknown binary '${name}' (known: ${Object.keys(BINARIES).join(', ')})`);
  return path.join(buildDir, ...parts);
}

const verbose = process.env.THAW_TEST_VERBOSE === '1';
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------
// Cleanup registry

const live = new Set();   // handles of processes not yet seen to exit
const tmpDirs = [];
// Sanitizer or valgrind reports of the project's own binaries (ASan exits 23,
// LSan 24, valgrind 25 in the meson test setups), however the process ended:
// the file's after() hook fails on them, so a test that stops a binary
// without looking at its exit still fails under the asan setup.
const SANITIZER_LINE = /AddressSanitizer|LeakSanitizer|runtime error:|==\d+== Invalid (read|write)/;
const SANITIZER_EXIT = new Set([23, 24, 25]);
const reports = [];

function killAllNow() {
  for (const h of live) {
    try { h.proc.kill('SIGKILL'); } catch { /* already gone */ }
  }
}

async function stopAll() {
  // Graceful first so a wrapped binary can still report (valgrind), then force.
  await Promise.all([...live].map((h) => h.stop('SIGTERM', 3000).catch(() => {})));
  if (reports.length) {
    const r = reports.splice(0);
    throw new Error(`sanitizer/valgrind report from ${r.map((h) => `${h.name} (pid ${h.pid}, exit ${h.exitCode})`).join(', ')}:\n` +
      r.map((h) => h.lines.filter((l) => l.stream === 'stderr').slice(-60).map((l) => l.line).join('\n')).join('\n---\n'));
  }
}

process.on('exit', () => {
  killAllNow();
  for (const f of myPortLocks) {
    try { fs.unlinkSync(f); } catch { /* best effort */ }
  }
  if (process.env.THAW_KEEP_TMP !== '1') {
    for (const d of tmpDirs) {
      try { fs.rmSync(d, { recursive: true, force: true }); } catch { /* best effort */ }
    }
  }
});
// A signal's default action skips 'exit' handlers: kill the children, then
// die of the same signal.
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => {
    killAllNow();
    process.kill(process.pid, sig);
  });
}
// Only register a node:test hook when running as a test: calling after() in a
// plain script would make node:test print an empty TAP report.
const underTestRunner = process.env.NODE_TEST_CONTEXT !== undefined ||
  /\.test\.[cm]?js$/.test(process.argv[1] ?? '');
if (underTestRunner) after(stopAll);

/** Number of started processes that have not exited yet. */
export function liveProcessCount() {
  return live.size;
}

// ---------------------------------------------------------------------------
// Small utilities

// Ports handed out by freePort() come from below the kernel's ephemeral range
// and are reserved across processes with a lock file: a port from bind(0) may
// be taken, before the test binds it, by any outgoing connection (even a
// probe's self-connect to that very port) or by a parallel test's bind(0).
const portLockDir = path.join(os.tmpdir(), 'thaw-test-ports');
const myPortLocks = [];

function ephemeralRangeStart() {
  try {
    const lo = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    if (Number.isInteger(lo) && lo > 4096) return lo;
  } catch { /* not Linux: fall through */ }
  return 32768;
}
const portRange = (() => {
  const hi = ephemeralRangeStart();
  return { lo: Math.max(1024, hi - 12000), hi };
})();

function pidAlive(pid) {
  try { process.kill(pid, 0); return true; } catch (e) { return e.code === 'EPERM'; }
}

/** Takes the cross-process lock for port, clearing one left by a dead process. */
function lockPort(port) {
  fs.mkdirSync(portLockDir, { recursive: true });
  const f = path.join(portLockDir, String(port));
  for (let i = 0; i < 2; i++) {
    try {
      fs.writeFileSync(f, String(process.pid), { flag: 'wx' });
      myPortLocks.push(f);
      return true;
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
      const owner = Number(fs.readFileSync(f, 'utf8') || 0);
      if (owner && pidAlive(owner)) return false;
      try { fs.unlinkSync(f); } catch { /* another process cleared it */ }
    }
  }
  return false;
}

function canBind(port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', () => resolve(false));
    srv.listen({ port, host: '127.0.0.1', exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/**
 * A TCP port on 127.0.0.1, free now and reserved for this process: no other
 * test process gets it from freePort(), and no outgoing connection uses it, so
 * a server may start on it later (a backend that is down at first) or restart
 * on it (a scaler restarted in place).
 */
export async function freePort() {
  const span = portRange.hi - portRange.lo;
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = portRange.lo + Math.floor(Math.random() * span);
    if (!lockPort(port)) continue;
    if (await canBind(port)) return port;
  }
  throw new Error(`freePort: no free port in ${portRange.lo}-${portRange.hi - 1} after 200 tries`);
}

/** One `ss -tnop` reading; see tcpKeepalive. */
function tcpSockets(pid, port, side) {
  const filter = `( ${side === 'local' ? 'sport' : 'dport'} = :${port} )`;
  return new Promise((resolve, reject) => {
    execFile('ss', ['-tnopH', 'state', 'established', filter], (err, stdout) => {
      if (err) { reject(err); return; }
      const toSeconds = (t) => {
        const m = /^(?:(\d+)min)?(?:(\d+)sec)?(?:(\d+)ms)?$/.exec(t);
        return m ? Number(m[1] ?? 0) * 60 + Number(m[2] ?? 0) + Number(m[3] ?? 0) / 1000 : NaN;
      };
      resolve(stdout.split('\n').filter((l) => l.includes(`pid=${pid},`)).map((line) => {
        const k = /timer:\(keepalive,([^,]+),/.exec(line);
        return { line, keepaliveInSeconds: k ? toSeconds(k[1]) : null };
      }));
    });
  });
}

/**
 * The established TCP sockets of process pid on a port (`local`: its own
 * port is `port`; `remote`: the peer's is), each with the seconds to its
 * keepalive probe, or null when it has no keepalive timer. A socket with
 * bytes unacknowledged shows its retransmission timer instead, so this
 * reads again (up to 5 s) until there is one socket at least and none such.
 */
export async function tcpKeepalive(pid, port, side = 'local') {
  let socks = [];
  await waitUntil(async () => {
    socks = await tcpSockets(pid, port, side);
    return socks.length >= 1 && socks.every((s) => !/timer:\(on,/.test(s.line));
  }, 5000, { what: `a quiet connection on ${side} port ${port}` });
  return socks;
}

/** A fresh directory under the system temp dir, removed at process exit. */
export function tmpDir(prefix = 'thaw-test-') {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}

/**
 * Polls fn() until it returns a truthy value (returned) or timeoutMs passes
 * (throws, with the last error thrown by fn as cause).
 */
export async function waitUntil(fn, timeoutMs = 5000, { intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let lastErr;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      lastErr = e;
    }
    if (Date.now() >= deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}` +
        (lastErr ? `: ${lastErr.message}` : ''), { cause: lastErr });
    }
    await sleep(intervalMs);
  }
}

/** Resolves true when a TCP connection to 127.0.0.1:port is accepted. */
export function canConnect(port, host = '127.0.0.1', timeoutMs = 1000) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host });
    const done = (ok) => { s.destroy(); resolve(ok); };
    s.setTimeout(timeoutMs, () => done(false));
    s.on('connect', () => done(true));
    s.on('error', () => done(false));
  });
}

// ---------------------------------------------------------------------------
// Processes

const MAX_LINES = 50000;

function signalExitCode(signal) {
  const n = os.constants.signals[signal];
  return n ? 128 + n : 128;
}

/**
 * Starts cmd with args and captures its output line by line.
 *
 * opts: env (merged over process.env), cwd, readyLogRegex (resolve only once a
 * line of stdout or stderr matches), timeoutMs for that wait (default 10000),
 * name (for messages), prefix (an argv put before the command, after any
 * THAW_TEST_WRAPPER: a program that execs the rest, such as unshare).
 *
 * Resolves to a handle:
 *   proc               the ChildProcess
 *   pid, name
 *   stdout, stderr     arrays of lines so far; lines: [{stream, line, t}]
 *   output()           everything so far, one string (for failure messages)
 *   mark()             current line count, to pass as {since} to waitForLog
 *   waitForLog(re, timeoutMs = 5000, {since = 0})
 *                      resolves to the first matching line's RegExp match
 *                      (match.input is the line); rejects on timeout or exit
 *   exited             promise of the exit code (see stop)
 *   exitCode           null while running
 *   stop(signal = 'SIGTERM', timeoutMs = 5000)
 *                      sends signal, waits, SIGKILLs after timeoutMs; resolves
 *                      to the exit code, or 128 + signal number when killed
 *                      by a signal (143 for SIGTERM, 137 for SIGKILL);
 *                      stopTimedOut is set when SIGKILL was needed
 *   kill()             SIGKILL, resolves to the exit code (137)
 * Rejects if the process cannot start, exits before readyLogRegex matches, or
 * the match does not come in time (the process is then killed).
 */
export async function spawnProcess(cmd, args = [], opts = {}) {
  const { env = {}, cwd = repoRoot, readyLogRegex = null, timeoutMs = 10000 } = opts;
  const name = opts.name ?? path.basename(cmd);
  let argv = [cmd, ...args.map(String)];
  const wrapper = process.env.THAW_TEST_WRAPPER;
  if (wrapper && path.resolve(cmd).startsWith(buildDir + path.sep)) {
    argv = [...wrapper.split(/\s+/).filter(Boolean), ...argv];
  }
  // A command that sets up the process's surroundings and then execs the
  // rest (e.g. unshare), so the pid is still the program's.
  if (opts.prefix) argv = [...opts.prefix, ...argv];
  const proc = spawn(argv[0], argv.slice(1), {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });

  const ours = path.resolve(cmd).startsWith(buildDir + path.sep);
  const h = {
    proc,
    pid: proc.pid,
    name,
    stdout: [],
    stderr: [],
    lines: [],
    exitCode: null,
    stopTimedOut: false,
  };
  const waiters = new Set();   // called on every new line and on close
  let closed = false;
  const notify = () => { for (const w of [...waiters]) w(); };

  const onLine = (stream) => (line) => {
    if (h.lines.length < MAX_LINES) {
      h[stream].push(line);
      h.lines.push({ stream, line, t: performance.now() });
    }
    if (verbose) process.stderr.write(`[${name} ${stream}] ${line}\n`);
    if (ours && !h.reported && SANITIZER_LINE.test(line)) {
      h.reported = true;
      reports.push(h);
    }
    notify();
  };
  readline.createInterface({ input: proc.stdout }).on('line', onLine('stdout'));
  readline.createInterface({ input: proc.stderr }).on('line', onLine('stderr'));

  let resolveExited;
  h.exited = new Promise((resolve) => { resolveExited = resolve; });
  proc.on('exit', (code, signal) => {
    h.exitCode = code ?? signalExitCode(signal);
    h.exitSignal = signal;
    if (ours && !h.reported && SANITIZER_EXIT.has(h.exitCode)) {
      h.reported = true;
      reports.push(h);
    }
    live.delete(h);
    resolveExited(h.exitCode);
  });
  const spawnError = new Promise((resolve) => proc.on('error', resolve));
  proc.on('close', () => { closed = true; notify(); });
  // An 'error' (ENOENT, EACCES) means there is no process to track.
  proc.on('error', () => {
    closed = true;
    live.delete(h);
    if (h.exitCode === null) { h.exitCode = 127; resolveExited(127); }
    notify();
  });
  live.add(h);

  h.output = () => h.lines.map((l) => `[${l.stream}] ${l.line}`).join('\n');
  h.mark = () => h.lines.length;
  const tail = () => h.lines.slice(-30).map((l) => `  [${l.stream}] ${l.line}`).join('\n');

  h.waitForLog = (re, waitMs = 5000, { since = 0 } = {}) => new Promise((resolve, reject) => {
    let next = since;
    let timer = null;
    const check = () => {
      for (; next < h.lines.length; next++) {
        const m = re.exec(h.lines[next].line);
        if (m) { finish(); resolve(m); return; }
      }
      if (closed) {
        finish();
        reject(new Error(`${name} (pid ${h.pid}) exited with ${h.exitCode} before logging ${re}; last output:\n${tail()}`));
      }
    };
    const finish = () => { waiters.delete(check); clearTimeout(timer); };
    timer = setTimeout(() => {
      finish();
      reject(new Error(`${name} (pid ${h.pid}) did not log ${re} within ${waitMs} ms; last output:\n${tail()}`));
    }, waitMs);
    waiters.add(check);
    check();
  });

  h.stop = async (signal = 'SIGTERM', waitMs = 5000) => {
    if (h.exitCode !== null || closed) return h.exited;
    try { proc.kill(signal); } catch { /* raced with exit */ }
    let timer;
    const timedOut = new Promise((resolve) => { timer = setTimeout(() => resolve(true), waitMs); });
    const t = await Promise.race([h.exited.then(() => false), timedOut]);
    clearTimeout(timer);
    if (t) {
      h.stopTimedOut = true;
      try { proc.kill('SIGKILL'); } catch { /* raced with exit */ }
    }
    return h.exited;
  };
  h.kill = () => h.stop('SIGKILL', 5000);

  const err = await Promise.race([spawnError, sleep(0).then(() => null)]);
  if (err) throw new Error(`cannot start ${argv[0]}: ${err.message}`, { cause: err });
  if (readyLogRegex) {
    try {
      await h.waitForLog(readyLogRegex, timeoutMs);
    } catch (e) {
      await h.kill();
      throw e;
    }
  }
  return h;
}

// ---------------------------------------------------------------------------
// Redis

function redisPing(port) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    let buf = '';
    const done = (ok) => { s.destroy(); resolve(ok); };
    s.setTimeout(1000, () => done(false));
    s.on('connect', () => s.write('*1\r\n$4\r\nPING\r\n'));
    s.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
    s.on('error', () => done(false));
  });
}

/**
 * Starts a real redis-server on 127.0.0.1 with no persistence, in a temp dir.
 * opts.port: fixed port (default: a free one). Resolves once PING answers.
 *
 * Returns {port, url, dir, process, stop(), kill(), restart(), cli(...args)}:
 *   stop()     SIGTERM, resolves to the exit code
 *   kill()     SIGKILL (a crash), resolves to the exit code
 *   restart()  stops it if running, starts again on the same port (empty)
 *   cli(...)   runs redis-cli -p PORT ...args, resolves to stdout without the
 *              final newline; rejects if redis-cli exits non-zero
 */
export async function startRedis(opts = {}) {
  const dir = opts.dir ?? tmpDir('thaw-redis-');
  let port = opts.port ?? await freePort();
  const r = { dir, process: null };

  const launch = async () => {
    const p = await spawnProcess(REDIS_SERVER, [
      '--port', port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', dir, '--daemonize', 'no', '--logfile', '', '--protected-mode', 'no',
    ], { name: `redis:${port}`, cwd: dir, readyLogRegex: /Ready to accept connections/, timeoutMs: 10000 });
    await waitUntil(() => redisPing(port), 5000, { what: `redis PING on port ${port}` });
    r.process = p;
  };

  for (let attempt = 0; ; attempt++) {
    try {
      await launch();
      break;
    } catch (e) {
      // freePort() can race with another test binding the same port.
      if (opts.port !== undefined || attempt >= 2 || !/Address already in use/.test(e.message)) throw e;
      port = await freePort();
    }
  }

  r.port = port;
  r.url = `redis://127.0.0.1:${port}`;
  r.stop = () => r.process.stop('SIGTERM', 5000);
  r.kill = () => r.process.kill();
  r.restart = async () => {
    if (r.process.exitCode === null) await r.stop();
    await launch();
  };
  r.cli = (...args) => new Promise((resolve, reject) => {
    execFile(REDIS_CLI, ['-h', '127.0.0.1', '-p', String(port), ...args.map(String)],
      { timeout: 10000 }, (err, stdout, stderr) => {
        if (err) {
          err.message += `\nstderr: ${stderr}`;
          reject(err);
          return;
        }
        resolve(stdout.replace(/\n$/, ''));
      });
  });
  return r;
}

// ---------------------------------------------------------------------------
// Prometheus

function prometheusConfig(targets, scrapeInterval) {
  const list = targets.map((t) => `'${t}'`).join(', ');
  // scrape_timeout may not exceed the interval; 1s intervals are common here.
  return [
    'global:',
    `  scrape_interval: ${scrapeInterval}`,
    `  scrape_timeout: ${scrapeInterval}`,
    `  evaluation_interval: ${scrapeInterval}`,
    'scrape_configs:',
    '  - job_name: thaw',
    '    static_configs:',
    `      - targets: [${list}]`,
    '',
  ].join('\n');
}

/**
 * Starts a real prometheus on 127.0.0.1 with a generated config scraping
 * scrapeTargets ('127.0.0.1:PORT', path /metrics, job 'thaw') every
 * scrapeInterval (default '1s'), its TSDB in a temp dir. Resolves once
 * /-/ready answers 200.
 *
 * Returns {port, url, dir, process, stop(), kill(), restart(), query(promql),
 * waitForSeries(promql, predicate, timeoutMs), setScrapeTargets(targets)}:
 *   query(promql)   GET /api/v1/query, resolves to the parsed JSON body
 *                   ({status, data: {resultType, result}}); rejects when
 *                   status is not 'success'
 *   waitForSeries(promql, predicate = r => r.length > 0, timeoutMs = 15000)
 *                   polls query until predicate(data.result) is true and
 *                   resolves to data.result
 *   setScrapeTargets(targets)  rewrites the config and POSTs /-/reload
 *   restart()       stops and starts again on the same port and TSDB
 */
export async function startPrometheus(opts = {}) {
  const { scrapeInterval = '1s' } = opts;
  let targets = opts.scrapeTargets ?? [];
  const dir = opts.dir ?? tmpDir('thaw-prom-');
  const cfg = path.join(dir, 'prometheus.yml');
  fs.writeFileSync(cfg, prometheusConfig(targets, scrapeInterval));
  let port = opts.port ?? await freePort();
  const pr = { dir, process: null };

  const ready = async () => {
    const res = await fetch(`http://127.0.0.1:${port}/-/ready`);
    await res.arrayBuffer();
    return res.status === 200;
  };
  const launch = async () => {
    const p = await spawnProcess(PROMETHEUS, [
      `--config.file=${cfg}`,
      `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--web.enable-lifecycle',
    ], { name: `prometheus:${port}`, cwd: dir, readyLogRegex: /Server is ready to receive web requests/, timeoutMs: 30000 });
    try {
      await waitUntil(ready, 10000, { what: `prometheus /-/ready on port ${port}` });
    } catch (e) {
      await p.kill();
      throw e;
    }
    pr.process = p;
  };

  for (let attempt = 0; ; attempt++) {
    try {
      await launch();
      break;
    } catch (e) {
      if (opts.port !== undefined || attempt >= 2 || !/address already in use/i.test(e.message)) throw e;
      port = await freePort();
    }
  }

  pr.port = port;
  pr.url = `http://127.0.0.1:${port}`;
  pr.stop = () => pr.process.stop('SIGTERM', 10000);
  pr.kill = () => pr.process.kill();
  pr.restart = async () => {
    if (pr.process.exitCode === null) await pr.stop();
    await launch();
  };
  pr.query = async (promql) => {
    const res = await fetch(`${pr.url}/api/v1/query?${new URLSearchParams({ query: promql })}`);
    const text = await res.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch {
      throw new Error(`prometheus query '${promql}': HTTP ${res.status}, not JSON: ${text.slice(0, 200)}`);
    }
    if (body.status !== 'success') {
      const e = new Error(`prometheus query '${promql}' failed: ${body.errorType}: ${body.error}`);
      e.errorType = body.errorType;
      throw e;
    }
    return body;
  };
  pr.waitForSeries = async (promql, predicate = (r) => r.length > 0, timeoutMs = 15000) => {
    const deadline = Date.now() + timeoutMs;
    let last = null;
    for (;;) {
      try {
        const body = await pr.query(promql);
        last = body.data.result;
        if (predicate(last)) return last;
      } catch (e) {
        if (e.errorType === 'bad_data') throw e;   // a bad query never improves
        last = e.message;
      }
      if (Date.now() >= deadline) {
        throw new Error(`prometheus: '${promql}' did not satisfy the predicate within ${timeoutMs} ms; last: ${JSON.stringify(last)}`);
      }
      await sleep(250);
    }
  };
  pr.setScrapeTargets = async (newTargets) => {
    targets = newTargets;
    fs.writeFileSync(cfg, prometheusConfig(targets, scrapeInterval));
    const res = await fetch(`${pr.url}/-/reload`, { method: 'POST' });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`prometheus reload: HTTP ${res.status}: ${text}`);
  };
  return pr;
}

// ---------------------------------------------------------------------------
// gRPC

// Loaded once at import so grpcClient() can be synchronous; a missing
// node_modules only fails the tests that use gRPC, with a hint.
let grpcModules = null;
let grpcImportError = null;
try {
  grpcModules = {
    grpc: await import('@grpc/grpc-js'),
    protoLoader: await import('@grpc/proto-loader'),
  };
} catch (e) {
  grpcImportError = e;
}
let grpcLoaded = null;

/**
 * grpc-js and the service constructors loaded from proto/externalscaler.proto
 * and proto/health.proto, for in-process reference servers and clients:
 * {grpc, packageDefinition, ExternalScaler, Health, loaderOptions}.
 */
export function loadGrpc() {
  if (grpcLoaded) return grpcLoaded;
  if (!grpcModules) {
    throw new Error('cannot load @grpc/grpc-js or @grpc/proto-loader: run scripts/install-deps.sh (npm ci at the repo root)',
      { cause: grpcImportError });
  }
  const { grpc, protoLoader } = grpcModules;
  const loaderOptions = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
  const packageDefinition = protoLoader.loadSync(
    [path.join(repoRoot, 'proto', 'externalscaler.proto'), path.join(repoRoot, 'proto', 'health.proto')],
    loaderOptions);
  const root = grpc.loadPackageDefinition(packageDefinition);
  grpcLoaded = {
    grpc,
    packageDefinition,
    loaderOptions,
    ExternalScaler: root.externalscaler.ExternalScaler,
    Health: root.grpc.health.v1.Health,
  };
  return grpcLoaded;
}

/**
 * A gRPC client for address ('127.0.0.1:PORT'), plaintext HTTP/2. One channel
 * serves both services. Unary calls resolve to the response object and reject
 * with the grpc-js error (err.code, err.details); each takes an optional
 * {deadlineMs} (default opts.deadlineMs, 5000).
 *
 *   isActive(ref)                 ref = {name, namespace, scalerMetadata: {...}}
 *   getMetricSpec(ref)
 *   getMetrics({scaledObjectRef, metricName})
 *   healthCheck(service = '')     resolves to {status: 'SERVING' | ...}
 *   unaryRaw(path, bytes)         arbitrary request bytes to a method path
 *                                 ('/externalscaler.ExternalScaler/IsActive'),
 *                                 resolves to the raw response Buffer
 *   streamIsActive(ref)           see below
 *   waitForReady(timeoutMs)       resolves when the channel is connected
 *   close()
 *
 * streamIsActive(ref) returns a stream collector:
 *   messages                      [{msg, t}], t = performance.now() in ms
 *   error, status, ended          set when the stream fails or finishes
 *   waitFor(pred, timeoutMs = 5000, {since = 0})
 *                                 resolves to the first {msg, t, index} from
 *                                 index since on for which pred(msg, messages)
 *                                 is true; rejects on timeout, or when the
 *                                 stream ends or fails first
 *   cancel()                      cancels the call (no error is recorded)
 */
export function grpcClient(address, opts = {}) {
  const { grpc, ExternalScaler, Health } = loadGrpc();
  const defaultDeadline = opts.deadlineMs ?? 5000;
  const channelOptions = {
    // Tests restart servers; reconnect quickly rather than after seconds.
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 1000,
  };
  const scaler = new ExternalScaler(address, grpc.credentials.createInsecure(), channelOptions);
  const health = new Health(address, grpc.credentials.createInsecure(),
    { ...channelOptions, channelOverride: scaler.getChannel() });

  const callOpts = (o) => ({ deadline: Date.now() + (o?.deadlineMs ?? defaultDeadline) });
  const unary = (client, method, req, o) => new Promise((resolve, reject) => {
    client[method](req, new grpc.Metadata(), callOpts(o), (err, res) => (err ? reject(err) : resolve(res)));
  });
  const identity = (b) => b;

  const c = {
    grpc,
    scaler,
    health,
    isActive: (ref, o) => unary(scaler, 'IsActive', ref, o),
    getMetricSpec: (ref, o) => unary(scaler, 'GetMetricSpec', ref, o),
    getMetrics: (req, o) => unary(scaler, 'GetMetrics', req, o),
    healthCheck: (service = '', o) => unary(health, 'Check', { service }, o),
    unaryRaw: (methodPath, bytes, o) => new Promise((resolve, reject) => {
      scaler.makeUnaryRequest(methodPath, identity, identity, Buffer.from(bytes),
        new grpc.Metadata(), callOpts(o), (err, res) => (err ? reject(err) : resolve(res)));
    }),
    waitForReady: (timeoutMs = 5000) => new Promise((resolve, reject) => {
      scaler.waitForReady(Date.now() + timeoutMs, (err) => (err ? reject(err) : resolve()));
    }),
    close: () => scaler.close(),
  };

  c.streamIsActive = (ref) => {
    const call = scaler.StreamIsActive(ref);
    const s = { call, messages: [], error: null, status: null, ended: false };
    const waiters = new Set();
    const notify = () => { for (const w of [...waiters]) w(); };
    let cancelled = false;
    call.on('data', (msg) => { s.messages.push({ msg, t: performance.now() }); notify(); });
    call.on('error', (e) => {
      if (!cancelled) s.error = e;
      s.ended = true;
      notify();
    });
    call.on('status', (st) => { s.status = st; notify(); });
    call.on('end', () => { s.ended = true; notify(); });
    s.cancel = () => { cancelled = true; call.cancel(); };
    s.waitFor = (pred, timeoutMs = 5000, { since = 0 } = {}) => new Promise((resolve, reject) => {
      let next = since;
      const check = () => {
        for (; next < s.messages.length; next++) {
          const e = s.messages[next];
          if (pred(e.msg, s.messages)) { finish(); resolve({ ...e, index: next }); return; }
        }
        if (s.ended || s.error) {
          finish();
          reject(s.error ?? new Error(`stream ended after ${s.messages.length} messages without a match`));
        }
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`no matching StreamIsActive message within ${timeoutMs} ms; got ${JSON.stringify(s.messages.map((e) => e.msg))}`));
      }, timeoutMs);
      const finish = () => { waiters.delete(check); clearTimeout(timer); };
      waiters.add(check);
      check();
    });
    return s;
  };
  return c;
}
