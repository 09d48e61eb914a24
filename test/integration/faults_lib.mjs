// Helpers for the fault-injection tests (faults_*.test.mjs): a StreamIsActive
// client that behaves like KEDA's external-push scaler, RSS from /proc, a raw
// HTTP/1.1 client that reports exactly what arrived (so a truncated response
// can be told from a complete one), and the "accepted = answered" check with
// the outcome breakdown in the failure message.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';

import { assert, metricSum, sleep, waitUntil } from './activator_lib.mjs';
import { loadGrpc } from './lib/harness.mjs';

/** VmRSS of pid in KiB (NaN once the process is gone). */
export function rssKiB(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}

/** Number of open file descriptors of pid. */
export function fdCount(pid) {
  return fs.readdirSync(`/proc/${pid}/fd`).length;
}

/** Soft and hard RLIMIT_NOFILE of pid, from /proc/PID/limits. */
export function nofileLimits(pid = process.pid) {
  const m = /Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)/.exec(fs.readFileSync(`/proc/${pid}/limits`, 'utf8'));
  const n = (s) => (s === 'unlimited' ? Infinity : Number(s));
  return { soft: n(m[1]), hard: n(m[2]) };
}

/**
 * Shells and systemd start processes with a soft open-file limit of 1024
 * under a far higher hard one, and both binaries raise the soft one at
 * start. Calls start() (which spawns one of them, a child inheriting this
 * runner's limits) with the runner's soft limit lowered to 1024, then puts
 * it back; checks that the process started has soft = hard and logs the
 * raised limit in event=listening. Returns start()'s result (the caller
 * stops it), or null when the hard limit leaves nothing to raise to.
 */
export async function checkNofileRaised(t, start) {
  const own = nofileLimits();
  if (!Number.isFinite(own.hard) || own.hard <= 1024) {
    t.skip(`hard limit ${own.hard}: nothing to raise to`);
    return null;
  }
  const setSoft = (soft) => new Promise((resolve) => {
    execFile('/usr/bin/prlimit', ['--pid', String(process.pid), `--nofile=${soft}:${own.hard}`], { timeout: 5000 },
      (err, stdout, stderr) => resolve(err ? `${err.message} ${stderr}` : null));
  });
  assert.equal(await setSoft(1024), null, 'prlimit');
  let started;
  try {
    started = await start();
  } finally {
    assert.equal(await setSoft(own.soft), null, 'prlimit back');
  }
  assert.deepEqual(nofileLimits(started.proc.pid), { soft: own.hard, hard: own.hard });
  assert.ok(started.proc.lines.some(({ line }) => /event=listening .*fd_limit=(\d+)/.exec(line)?.[1] === String(own.hard)),
    'event=listening logs the raised limit');
  return started;
}

/** True when the binaries under test were built with AddressSanitizer. */
export const underSanitizer = /asan/i.test(process.env.THAW_BUILD_DIR ?? '') ||
  (process.env.ASAN_OPTIONS ?? '') !== '';
export const underValgrind = Boolean(process.env.THAW_TEST_WRAPPER);

/**
 * A StreamIsActive consumer with KEDA's retry loop
 * (kedacore/keda pkg/scalers/external_scaler.go, runStreamIsActive): open the
 * stream at once; whenever it ends, wait retryDuration before opening it
 * again, retryDuration starting at 2 s and doubling to 1 min after each wait;
 * a clean end of stream (status OK, Go's io.EOF) resets it to 2 s. The channel
 * keeps grpc's default reconnect backoff (1 s growing to 120 s, as grpc-go's
 * KEDA uses), not the quick one the other tests use, and no wait-for-ready: a
 * call made while the scaler is down fails at once, like KEDA's.
 *
 * Returns {attempts: [{t, tEnd, code, details, messages}], pushes: [{result,
 * t, attempt}], waitPush(pred, timeoutMs, {since}), waitOpen(n, timeoutMs),
 * stop()}. attempt.code: null while the stream is open, 0 for a clean end.
 */
export function kedaPushClient(address, ref) {
  const { grpc, ExternalScaler } = loadGrpc();
  const client = new ExternalScaler(address, grpc.credentials.createInsecure(),
    { 'grpc.use_local_subchannel_pool': 1 });
  const k = { attempts: [], pushes: [], stopped: false, call: null };
  const waiters = new Set();
  const notify = () => { for (const w of [...waiters]) w(); };
  let retryMs = 2000;
  let timer = null;
  let wake = null;

  const runOnce = () => new Promise((resolve) => {
    const at = { t: Date.now(), tEnd: null, code: null, details: null, messages: 0 };
    const index = k.attempts.length;
    k.attempts.push(at);
    const call = client.StreamIsActive(ref);
    k.call = call;
    let done = false;
    const end = (code, details) => {
      if (done) return;
      done = true;
      at.tEnd = Date.now();
      at.code = code;
      at.details = details;
      notify();
      resolve(code);
    };
    call.on('data', (msg) => {
      at.messages++;
      k.pushes.push({ result: msg.result, t: Date.now(), attempt: index });
      notify();
    });
    call.on('status', (st) => end(st.code, st.details));
    call.on('error', (e) => end(e.code ?? -1, e.details ?? e.message));
    notify();
  });

  k.done = (async () => {
    let code = await runOnce();
    if (code === grpc.status.OK) retryMs = 2000;
    while (!k.stopped) {
      await new Promise((resolve) => { wake = resolve; timer = setTimeout(resolve, retryMs); });
      retryMs = Math.min(retryMs * 2, 60000);
      if (k.stopped) break;
      code = await runOnce();
      if (code === grpc.status.OK) retryMs = 2000;
    }
  })();

  k.open = () => k.attempts.filter((a) => a.code === null).length;
  k.waitPush = (pred, timeoutMs = 5000, { since = 0 } = {}) => new Promise((resolve, reject) => {
    const check = () => {
      const hit = k.pushes.slice(since).find(pred);
      if (hit) { finish(); resolve(hit); }
    };
    const t = setTimeout(() => {
      finish();
      reject(new Error(`no matching StreamIsActive push within ${timeoutMs} ms; attempts ${JSON.stringify(k.attempts)}, pushes ${JSON.stringify(k.pushes)}`));
    }, timeoutMs);
    const finish = () => { waiters.delete(check); clearTimeout(t); };
    waiters.add(check);
    check();
  });
  k.stop = async () => {
    k.stopped = true;
    clearTimeout(timer);
    wake?.();
    k.call?.cancel();
    await k.done;
    client.close();
  };
  return k;
}

/**
 * Raw HTTP/1.1 POST of a JSON body on a fresh connection; collects every byte
 * until the peer closes (or totalMs). Resolves {text, status, head, body,
 * complete, closed, reset, error, tFirst, tEnd}: complete is true only when the
 * response ended by its own framing (a zero-size last chunk, or Content-Length
 * bytes), which is what a client library would call a successful response.
 * opts.onData(socket, bytesSoFar) lets a caller act mid-response.
 */
export function rawPost(port, path, body, opts = {}) {
  const { totalMs = 20000, headers = {}, onData } = opts;
  return new Promise((resolve) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    const bufs = [];
    let n = 0;
    const out = { closed: false, reset: false, error: null, tFirst: 0, tEnd: 0 };
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(total);
      out.tEnd = Date.now();
      s.destroy();
      const text = Buffer.concat(bufs).toString('latin1');
      Object.assign(out, parseRawResponse(text));
      resolve(out);
    };
    const total = setTimeout(finish, totalMs);
    s.on('data', (d) => {
      if (!out.tFirst) out.tFirst = Date.now();
      bufs.push(d);
      n += d.length;
      onData?.(s, n, Buffer.concat(bufs).toString('latin1'));
    });
    s.on('end', () => { out.closed = true; finish(); });
    s.on('close', () => { out.closed = true; finish(); });
    s.on('error', (e) => {
      if (e.code === 'ECONNRESET') out.reset = true;
      out.error = e.code ?? e.message;
      out.closed = true;
      finish();
    });
    const payload = typeof body === 'string' ? body : JSON.stringify(body);
    const extra = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
    s.on('connect', () => s.write(`POST ${path} HTTP/1.1\r\nHost: faults\r\nContent-Type: application/json\r\n` +
      `${extra}Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`));
  });
}

/**
 * Splits the first HTTP/1.1 response out of raw text: {text, status, head,
 * body, complete}. A chunked body is decoded as far as it goes; complete
 * means its zero-size last chunk (or all Content-Length bytes) arrived.
 */
export function parseRawResponse(text) {
  const i = text.indexOf('\r\n\r\n');
  if (i < 0) return { text, status: null, head: text, body: '', complete: false };
  const head = text.slice(0, i);
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(head);
  const status = m ? Number(m[1]) : null;
  let rest = text.slice(i + 4);
  if (/\r\ntransfer-encoding:\s*chunked/i.test(head)) {
    let body = '';
    for (;;) {
      const nl = rest.indexOf('\r\n');
      if (nl < 0) return { text, status, head, body, complete: false };
      const size = parseInt(rest.slice(0, nl), 16);
      if (Number.isNaN(size)) return { text, status, head, body, complete: false };
      if (size === 0) return { text, status, head, body, complete: rest.slice(nl + 2).startsWith('\r\n') };
      if (rest.length < nl + 2 + size + 2) {
        body += rest.slice(nl + 2, nl + 2 + size);
        return { text, status, head, body, complete: false };
      }
      body += rest.slice(nl + 2, nl + 2 + size);
      rest = rest.slice(nl + 2 + size + 2);
    }
  }
  const cl = /\r\ncontent-length:\s*(\d+)/i.exec(head);
  if (cl) {
    const want = Number(cl[1]);
    return { text, status, head, body: rest.slice(0, want), complete: rest.length >= want };
  }
  // Neither: the body ends at the close, which a client cannot tell from a cut.
  return { text, status, head, body: rest, complete: false };
}

/** The SSE data payloads of an event-stream body, in order. */
export function sseData(body) {
  return body.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
}

/** Outcome counts of the activator as {outcome: n} (non-zero ones), summed over models. */
export async function outcomeCounts(act, model) {
  const m = await act.metrics();
  const out = {};
  for (const [k, v] of m) {
    if (!k.startsWith('thaw_activator_requests_total{') || v === 0) continue;
    if (model && !k.includes(`model="${model}"`)) continue;
    const o = /outcome="([^"]+)"/.exec(k)[1];
    out[o] = (out[o] ?? 0) + v;
  }
  return out;
}

/**
 * accepted = answered: once nothing is held or in flight, the activator's
 * thaw_activator_requests_accepted_total equals the sum of
 * thaw_activator_requests_total over every model and outcome. Resolves to
 * {accepted, outcomes}; the failure message carries the breakdown.
 */
export async function accountedFor(act, timeoutMs = 8000) {
  let last = null;
  try {
    await waitUntil(async () => {
      const m = await act.metrics();
      last = {
        accepted: metricSum(m, 'thaw_activator_requests_accepted_total'),
        ended: metricSum(m, 'thaw_activator_requests_total'),
        held: metricSum(m, 'thaw_activator_held_requests'),
        inflight: metricSum(m, 'thaw_activator_inflight_requests'),
      };
      return last.accepted === last.ended && last.held === 0 && last.inflight === 0;
    }, timeoutMs, { what: 'accepted == sum of outcomes, nothing held or in flight' });
  } catch (e) {
    e.message += `; last ${JSON.stringify(last)}, outcomes ${JSON.stringify(await outcomeCounts(act).catch(() => null))}`;
    throw e;
  }
  return { accepted: last.accepted, outcomes: await outcomeCounts(act) };
}

export { assert, sleep };
