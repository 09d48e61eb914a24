// Helpers for the thaw-activator integration tests: start the activator and
// fake vLLM servers on free loopback ports, speak raw HTTP/1.1 to them, read
// metrics. Everything is started through the shared harness, so it is killed
// when the test file ends.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';

import { binPath, freePort, spawnProcess, tmpDir, waitUntil } from './lib/harness.mjs';

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Parses a logfmt line's ts= into epoch ms. */
export function logTs(line) {
  const m = /ts=(\S+)/.exec(line);
  return m ? Date.parse(m[1]) : NaN;
}

/**
 * Starts thaw-fake-vllm. opts: model, port (default: free), loadDelayMs,
 * tokensPerSecond, maxBatch, ttftMs, host (to listen on; 127.0.0.1), extra (array of args).
 * Resolves to {proc, port, url, readyAt (epoch ms, once ready), stop()}.
 * waitReady: resolve only after the server logs event=ready.
 */
export async function startFakeVllm(opts = {}) {
  const port = opts.port ?? await freePort();
  const args = ['--listen', `${opts.host ?? '127.0.0.1'}:${port}`, '--model', opts.model ?? 'm1',
    '--load-delay-ms', opts.loadDelayMs ?? 0, '--tokens-per-second', opts.tokensPerSecond ?? 1000,
    '--max-batch', opts.maxBatch ?? 256, '--ttft-ms', opts.ttftMs ?? 1,
    ...(opts.extra ?? [])];
  const proc = await spawnProcess(binPath('thaw-fake-vllm'), args, {
    name: `fake-vllm:${port}`, readyLogRegex: /event=listening/, timeoutMs: 10000,
  });
  const f = { proc, port, url: `http://127.0.0.1:${port}`, stop: (sig) => proc.stop(sig) };
  f.ready = async (timeoutMs = 20000) => {
    const m = await proc.waitForLog(/event=ready/, timeoutMs);
    return logTs(m.input);
  };
  if (opts.waitReady) f.readyAt = await f.ready();
  return f;
}

/**
 * Starts thaw-activator with config (an object, written to a temp file).
 * opts: redisUrl, instanceId, logLevel, env, args.
 * Resolves to {proc, port, adminPort, url, adminUrl, configPath, stop(),
 * metrics(), models(), writeConfig(cfg)}.
 */
export async function startActivator(config, opts = {}) {
  const dir = opts.dir ?? tmpDir('thaw-act-');
  const configPath = path.join(dir, 'activator.json');
  fs.writeFileSync(configPath, JSON.stringify(config));
  const port = await freePort();
  const adminPort = await freePort();
  const args = ['--config', configPath, '--listen', `127.0.0.1:${port}`,
    '--admin-listen', `127.0.0.1:${adminPort}`, '--log-level', opts.logLevel ?? 'info',
    '--instance-id', opts.instanceId ?? 'act-test'];
  if (opts.redisUrl) args.push('--redis-url', opts.redisUrl);
  args.push(...(opts.args ?? []));
  const proc = await spawnProcess(binPath('thaw-activator'), args, {
    name: 'activator', readyLogRegex: /event=listening/, timeoutMs: 15000, env: opts.env ?? {},
    prefix: opts.prefix,
  });
  const a = {
    proc, port, adminPort, dir, configPath,
    url: `http://127.0.0.1:${port}`,
    adminUrl: `http://127.0.0.1:${adminPort}`,
  };
  // A graceful stop must drain and exit 0: under a sanitizer or valgrind, a
  // report or a leak changes the exit code and fails the test here.
  a.stop = async (sig = 'SIGTERM', ms = 10000) => {
    const code = await proc.stop(sig, ms);
    if (sig === 'SIGTERM' && code !== 0) {
      throw new Error(`activator exited ${code} after SIGTERM; output:\n${proc.output().slice(-4000)}`);
    }
    if (/AddressSanitizer|LeakSanitizer|runtime error:|Invalid read|Invalid write|definitely lost/.test(proc.output())) {
      throw new Error(`sanitizer/valgrind report:\n${proc.output().slice(-4000)}`);
    }
    return code;
  };
  a.metricsText = async () => (await request(adminPort, { path: '/metrics' })).body.toString();
  a.metrics = async () => parseMetrics(await a.metricsText());
  a.models = async () => JSON.parse((await request(adminPort, { path: '/models' })).body.toString());
  a.model = async (name) => (await a.models()).models.find((m) => m.name === name);
  a.writeConfig = (cfg) => fs.writeFileSync(configPath, JSON.stringify(cfg));
  return a;
}

/** Parses Prometheus text into a Map of 'name{labels}' -> number. */
export function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

/** Sum of every sample of metric name whose labels contain all of want. */
export function metricSum(map, name, want = {}) {
  let sum = 0;
  for (const [k, v] of map) {
    const brace = k.indexOf('{');
    const n = brace < 0 ? k : k.slice(0, brace);
    if (n !== name) continue;
    const labels = brace < 0 ? '' : k.slice(brace);
    if (Object.entries(want).every(([lk, lv]) => labels.includes(`${lk}="${lv}"`))) sum += v;
  }
  return sum;
}

/** Runs promtool check metrics on text; resolves {code, out}. */
export function promtoolCheck(text) {
  return new Promise((resolve) => {
    const p = execFile('/usr/bin/promtool', ['check', 'metrics'], { timeout: 20000 },
      (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, out: stdout + stderr }));
    p.stdin.end(text);
  });
}

/**
 * One HTTP request with node's http client (fresh connection unless agent).
 * opts: method, path, headers, body (string/Buffer), agent, timeoutMs.
 * Resolves {status, headers, body (Buffer), tHead, tEnd} (performance-free
 * epoch ms); rejects on socket errors.
 */
export function request(port, opts = {}) {
  return new Promise((resolve, reject) => {
    const body = opts.body === undefined ? undefined
      : Buffer.isBuffer(opts.body) ? opts.body : Buffer.from(typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body));
    const headers = { ...(opts.headers ?? {}) };
    if (body !== undefined && headers['content-length'] === undefined && !headers['transfer-encoding']) {
      headers['content-length'] = body.length;
    }
    const req = http.request({
      host: opts.host ?? '127.0.0.1', port, method: opts.method ?? (body ? 'POST' : 'GET'), path: opts.path ?? '/',
      headers, agent: opts.agent ?? false,
    }, (res) => {
      const tHead = Date.now();
      const chunks = [];
      const chunkTimes = [];
      res.on('data', (c) => { chunks.push(c); chunkTimes.push(Date.now()); });
      res.on('end', () => resolve({
        status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks), chunks,
        chunkTimes, tHead, tEnd: Date.now(), socket: res.socket,
      }));
      res.on('error', reject);
    });
    req.setTimeout(opts.timeoutMs ?? 30000, () => req.destroy(new Error('client timeout')));
    req.on('error', reject);
    if (body !== undefined) req.end(body); else req.end();
  });
}

/** POST /v1/completions for model; resolves like request(). */
export function complete(port, model, opts = {}) {
  return request(port, {
    path: '/v1/completions', method: 'POST',
    body: { model, prompt: opts.prompt ?? 'hello', max_tokens: opts.maxTokens ?? 2, stream: opts.stream ?? false },
    headers: opts.headers, agent: opts.agent, timeoutMs: opts.timeoutMs,
  });
}

/**
 * Raw TCP exchange: sends data (string/Buffer or array of pieces with
 * delays), collects everything until the peer closes or idleMs of silence.
 * Resolves {text, closed}.
 */
export function rawExchange(port, pieces, { idleMs = 1500, gapMs = 0, totalMs = 20000 } = {}) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    const bufs = [];
    let closed = false;
    let idle = null;
    const finish = () => {
      clearTimeout(idle);
      clearTimeout(total);
      s.destroy();
      resolve({ text: Buffer.concat(bufs).toString('latin1'), closed });
    };
    const arm = () => { clearTimeout(idle); idle = setTimeout(finish, idleMs); };
    const total = setTimeout(finish, totalMs);
    s.on('data', (d) => { bufs.push(d); arm(); });
    s.on('end', () => { closed = true; finish(); });
    s.on('close', () => { closed = true; finish(); });
    s.on('error', (e) => { if (e.code === 'ECONNRESET') { closed = true; finish(); } else reject(e); });
    s.on('connect', async () => {
      const list = Array.isArray(pieces) ? pieces : [pieces];
      for (const p of list) {
        if (s.destroyed) return;
        s.write(p);
        if (gapMs) await sleep(gapMs);
      }
      arm();
    });
  });
}

/** Splits a raw HTTP/1.1 byte stream into responses' status codes (heads only). */
export function statusCodes(text) {
  return [...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
}

/**
 * SUBSCRIBEs to channel on a Redis at port with a raw RESP connection (the
 * scaler's side of the wake contract). Returns {messages: [{payload, t}],
 * waitFor(pred, timeoutMs), close()}.
 */
export function subscribe(port, channel) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    const sub = { messages: [], waiters: new Set() };
    let buf = Buffer.alloc(0);
    // Parses one RESP value at off; returns [value, next] or null if incomplete.
    const parse = (off) => {
      if (off >= buf.length) return null;
      const nl = buf.indexOf('\r\n', off);
      if (nl < 0) return null;
      const type = String.fromCharCode(buf[off]);
      const line = buf.toString('utf8', off + 1, nl);
      if (type === '+' || type === '-' || type === ':') return [line, nl + 2];
      if (type === '$') {
        const n = Number(line);
        if (n < 0) return [null, nl + 2];
        if (buf.length < nl + 2 + n + 2) return null;
        return [buf.toString('utf8', nl + 2, nl + 2 + n), nl + 2 + n + 2];
      }
      if (type === '*') {
        const n = Number(line);
        const out = [];
        let p = nl + 2;
        for (let i = 0; i < n; i++) {
          const v = parse(p);
          if (!v) return null;
          out.push(v[0]);
          p = v[1];
        }
        return [out, p];
      }
      throw new Error(`RESP type ${type}`);
    };
    s.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const v = parse(0);
        if (!v) break;
        buf = buf.subarray(v[1]);
        const [kind, , payload] = v[0];
        if (kind === 'subscribe') resolve(sub);
        if (kind === 'message') {
          sub.messages.push({ payload, t: Date.now() });
          for (const w of [...sub.waiters]) w();
        }
      }
    });
    s.on('error', reject);
    s.write(`*2\r\n$9\r\nSUBSCRIBE\r\n$${Buffer.byteLength(channel)}\r\n${channel}\r\n`);
    sub.close = () => s.destroy();
    sub.waitFor = (pred, timeoutMs = 5000) => new Promise((res, rej) => {
      const check = () => {
        const m = sub.messages.find(pred);
        if (m) { sub.waiters.delete(check); clearTimeout(timer); res(m); }
      };
      const timer = setTimeout(() => {
        sub.waiters.delete(check);
        rej(new Error(`no matching message on ${channel} within ${timeoutMs} ms; got ${JSON.stringify(sub.messages)}`));
      }, timeoutMs);
      sub.waiters.add(check);
      check();
    });
  });
}

/** The body of the first response in a raw HTTP/1.1 text (chunked or not). */
export function rawBody(text) {
  const i = text.indexOf('\r\n\r\n');
  const head = text.slice(0, i);
  let rest = text.slice(i + 4);
  if (!/transfer-encoding: chunked/i.test(head)) {
    const cl = /content-length: (\d+)/i.exec(head);
    return cl ? rest.slice(0, Number(cl[1])) : rest;
  }
  let out = '';
  for (;;) {
    const nl = rest.indexOf('\r\n');
    const n = parseInt(rest.slice(0, nl), 16);
    if (!n) return out;
    out += rest.slice(nl + 2, nl + 2 + n);
    rest = rest.slice(nl + 2 + n + 2);
  }
}

/** Asserts accepted == sum of outcomes once nothing is in flight. */
export async function assertAccounted(act) {
  await waitUntil(async () => {
    const m = await act.metrics();
    const accepted = metricSum(m, 'thaw_activator_requests_accepted_total');
    const ended = metricSum(m, 'thaw_activator_requests_total');
    return accepted === ended && metricSum(m, 'thaw_activator_held_requests') === 0 &&
      metricSum(m, 'thaw_activator_inflight_requests') === 0;
  }, 5000, { what: 'accepted == sum of outcomes' });
}

/**
 * For a model whose one endpoint takes one request at a time
 * (maxConcurrencyPerEndpoint 1): a slow streaming completion takes the slot
 * and one more request queues behind it in the activator. Resolves, once the
 * second is queued, to {streaming, queued}: promises that never reject (an
 * error becomes {status: 'error ...'}), so a failing assertion in between
 * does not leave them unhandled.
 */
export async function fillSlotAndQueue(act, model) {
  const settle = (p) => p.catch((e) => ({ status: `error ${e.message}` }));
  const streaming = settle(complete(act.port, model, { stream: true, maxTokens: 40, timeoutMs: 20000 }));
  await sleep(200);
  const queued = settle(complete(act.port, model, { timeoutMs: 20000 }));
  await waitUntil(async () => (await act.model(model)).held === 1, 3000, { what: `${model}: one queued at the cap` });
  return { streaming, queued };
}

export { assert, freePort, tmpDir, waitUntil };
