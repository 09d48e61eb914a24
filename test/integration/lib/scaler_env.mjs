// Helpers for the thaw-scaler integration tests (scaler_*.test.mjs): start the
// real scaler binary and the fake vLLM exporter, talk to the scaler's HTTP
// port, parse its /metrics, and a minimal RESP connection for timing-sensitive
// Redis commands (PUBLISH without forking redis-cli per message).
//
// Everything here stands on lib/harness.mjs: processes are registered there
// and killed when the test file ends.

import net from 'node:net';

import { binPath, freePort, grpcClient, loadGrpc, spawnProcess, waitUntil } from './harness.mjs';

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The fast token-rate query: rate() over 5 s needs only two 1 s scrapes. */
export const FAST_QUERY = 'sum by (model_name) (rate(vllm:generation_tokens_total[5s]))';

/** Flags making the scaler react within a second or two. */
export const FAST_FLAGS = {
  'prometheus-interval-ms': 500,
  'redis-interval-ms': 200,
  'staleness-limit-seconds': 3,
  'scale-down-stabilization-seconds': 0,
  'bursty-scale-down-stabilization-seconds': 0,
  'held-fresh-seconds': 5,
  'token-rate-query': FAST_QUERY,
  // Signal tests use keys of every shape; scaler_tenancy.test.mjs tests the
  // default prefix confinement on its own.
  'redis-key-prefix': '',
};

/** An address nothing listens on (for a source the test does not want). */
export async function deadUrl(scheme) {
  return `${scheme}://127.0.0.1:${await freePort()}`;
}

/**
 * Starts build/scaler/thaw-scaler on 127.0.0.1 with free ports.
 * opts: prometheusUrl, redisUrl (required: give deadUrl() for an unwanted
 * source), flags (merged over FAST_FLAGS; value null drops a flag), env.
 * Returns {proc, grpcPort, httpPort, address, httpBase, client, get(path,
 * init), json(path), metricsText(), metrics(), models(), model(name, model),
 * stop(signal)}. `client` is one grpcClient shared by the test file.
 */
export async function startScaler(opts = {}) {
  const flags = { ...FAST_FLAGS, ...(opts.flags ?? {}) };
  const args = ['--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--prometheus-url', opts.prometheusUrl, '--redis-url', opts.redisUrl];
  for (const [k, v] of Object.entries(flags)) {
    if (v !== null && v !== undefined) args.push(`--${k}`, String(v));
  }
  const proc = await spawnProcess(binPath('thaw-scaler'), args, {
    name: opts.name ?? 'thaw-scaler',
    env: opts.env ?? {},
    readyLogRegex: /event=listening grpc_port=\d+ http_port=\d+/,
    timeoutMs: 15000,
  });
  const m = await proc.waitForLog(/event=listening grpc_port=(\d+) http_port=(\d+)/);
  const s = {
    proc,
    grpcPort: Number(m[1]),
    httpPort: Number(m[2]),
  };
  s.address = `127.0.0.1:${s.grpcPort}`;
  s.httpBase = `http://127.0.0.1:${s.httpPort}`;
  s.client = grpcClient(s.address);
  s.get = async (p, init) => {
    const res = await fetch(s.httpBase + p, init);
    return { status: res.status, headers: res.headers, text: await res.text() };
  };
  s.json = async (p) => {
    const r = await s.get(p);
    if (r.status !== 200) throw new Error(`GET ${p}: HTTP ${r.status}: ${r.text}`);
    return JSON.parse(r.text);
  };
  s.metricsText = async () => {
    const r = await s.get('/metrics');
    if (r.status !== 200) throw new Error(`GET /metrics: HTTP ${r.status}`);
    return r.text;
  };
  s.metrics = async () => parseExposition(await s.metricsText());
  s.models = () => s.json('/models');
  /** The /models entry of the target (namespace 'default', scaledObject name). */
  s.model = async (name, namespace = 'default') => {
    const all = await s.models();
    return all.find((e) => e.scaledObject === name && e.namespace === namespace);
  };
  s.stop = async (signal = 'SIGTERM') => {
    s.client.close();
    return proc.stop(signal, 8000);
  };
  return s;
}

/**
 * A ScaledObjectRef as KEDA sends it: scalerMetadata holds the trigger's
 * metadata (all strings), KEDA's scalerAddress included; policy v1 unless the
 * metadata names one.
 */
export function scaledObjectRef(name, metadata, namespace = 'default') {
  // Signal and protocol tests assert v1's plain arithmetic (desired follows
  // the inputs at once, inactive as soon as they are); tests of policy v2,
  // the default, say policy: 'v2'.
  const md = { scalerAddress: 'thaw-scaler.keda:9090', policy: 'v1' };
  for (const [k, v] of Object.entries(metadata)) md[k] = String(v);
  return { name, namespace, scalerMetadata: md };
}

/** GetMetrics for ref: resolves to {value, valueFloat, metricName}. */
export async function getDesired(client, ref, metricName = '') {
  const res = await client.getMetrics({ scaledObjectRef: ref, metricName });
  if (res.metricValues.length !== 1) {
    throw new Error(`GetMetrics returned ${res.metricValues.length} values: ${JSON.stringify(res)}`);
  }
  const v = res.metricValues[0];
  return { value: v.metricValue, valueFloat: v.metricValueFloat, metricName: v.metricName };
}

/**
 * Waits until GetMetrics reports `want` replicas (int and float agree) and
 * resolves to the last answer. Failed calls count as "not yet".
 */
export async function waitDesired(client, ref, want, timeoutMs = 15000) {
  let last = null;
  try {
    return await waitUntil(async () => {
      last = await getDesired(client, ref);
      return last.value === want && last.valueFloat === want ? last : null;
    }, timeoutMs, { intervalMs: 100, what: `desired == ${want} for ${ref.name}` });
  } catch (e) {
    e.message += `; last answer ${JSON.stringify(last)}`;
    throw e;
  }
}

/** Waits until IsActive answers `want`. */
export async function waitActive(client, ref, want, timeoutMs = 15000) {
  return waitUntil(async () => (await client.isActive(ref)).result === want,
    timeoutMs, { intervalMs: 100, what: `IsActive == ${want} for ${ref.name}` });
}

/**
 * Parses the Prometheus text format into [{name, labels, value}] (comments
 * skipped). Enough for our own exposition: label values with \" \\ \n escapes.
 */
export function parseExposition(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/.exec(line);
    if (!m) throw new Error(`unparsable exposition line: ${line}`);
    const labels = {};
    if (m[2]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/g;
      let lm;
      while ((lm = re.exec(m[2])) !== null) {
        labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
      }
    }
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/** The error code of the first GOAWAY frame in bytes a server sent, or null. */
export function firstGoawayCode(bytes) {
  for (let off = 0; off + 9 <= bytes.length;) {
    const len = bytes.readUIntBE(off, 3);
    if (bytes[off + 3] === 7 && off + 9 + 8 <= bytes.length) return bytes.readUInt32BE(off + 9 + 4);
    off += 9 + len;
  }
  return null;
}

/** The value of the one sample named `name` whose labels include `labels`, or undefined. */
export function sampleValue(samples, name, labels = {}) {
  const hits = samples.filter((s) => s.name === name &&
    Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  if (hits.length > 1) throw new Error(`${hits.length} samples match ${name} ${JSON.stringify(labels)}`);
  return hits.length ? hits[0].value : undefined;
}

/**
 * Starts the fake vLLM exporter with models like {a: 100, b: 2500}
 * (generation tokens/s). Returns {proc, port, target: '127.0.0.1:PORT',
 * setRate(model, rate)}.
 */
export async function startFakeExporter(models) {
  const list = Object.entries(models).map(([k, v]) => `${k}=${v}`).join(',');
  const proc = await spawnProcess(binPath('thaw-fake-vllm'),
    ['--exporter-only', '--models', list, '--listen', '127.0.0.1:0'],
    { name: 'fake-vllm', readyLogRegex: /event=listening port=\d+/, timeoutMs: 10000 });
  const m = await proc.waitForLog(/event=listening port=(\d+)/);
  const port = Number(m[1]);
  return {
    proc,
    port,
    target: `127.0.0.1:${port}`,
    setRate: async (model, rate) => {
      const res = await fetch(`http://127.0.0.1:${port}/admin/rate`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, rate }),
      });
      const text = await res.text();
      if (res.status !== 200) throw new Error(`fake exporter /admin/rate: HTTP ${res.status}: ${text}`);
      return JSON.parse(text);
    },
  };
}

/**
 * A persistent RESP connection to Redis for commands whose timing matters.
 * command(...args) resolves to the reply (string, number, array or null) or
 * rejects with a Redis error; replies come back in order.
 */
export async function respConnect(port) {
  const sock = net.connect({ port, host: '127.0.0.1' });
  sock.setNoDelay(true);
  await new Promise((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', reject);
  });
  let buf = Buffer.alloc(0);
  const pending = [];
  let broken = null;

  // Returns [value, nextOffset] or null when buf holds no complete reply yet.
  const parse = (off) => {
    const eol = buf.indexOf('\r\n', off);
    if (eol < 0) return null;
    const type = String.fromCharCode(buf[off]);
    const line = buf.toString('utf8', off + 1, eol);
    const next = eol + 2;
    switch (type) {
      case '+': return [line, next];
      case '-': return [Object.assign(new Error(line), { redisError: true }), next];
      case ':': return [Number(line), next];
      case '$': {
        const n = Number(line);
        if (n < 0) return [null, next];
        if (buf.length < next + n + 2) return null;
        return [buf.toString('utf8', next, next + n), next + n + 2];
      }
      case '*': {
        const n = Number(line);
        if (n < 0) return [null, next];
        const arr = [];
        let o = next;
        for (let i = 0; i < n; i++) {
          const r = parse(o);
          if (!r) return null;
          arr.push(r[0]);
          o = r[1];
        }
        return [arr, o];
      }
      default:
        throw new Error(`bad RESP type byte ${buf[off]}`);
    }
  };
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      const r = parse(0);
      if (!r) break;
      buf = buf.subarray(r[1]);
      const p = pending.shift();
      if (!p) continue;
      if (r[0] instanceof Error) p.reject(r[0]);
      else p.resolve(r[0]);
    }
  });
  const fail = (e) => {
    broken = e;
    while (pending.length) pending.shift().reject(e);
  };
  sock.on('error', fail);
  sock.on('close', () => fail(new Error('redis connection closed')));

  return {
    command: (...args) => new Promise((resolve, reject) => {
      if (broken) {
        reject(broken);
        return;
      }
      const parts = [`*${args.length}\r\n`];
      for (const a of args) {
        const s = String(a);
        parts.push(`$${Buffer.byteLength(s)}\r\n${s}\r\n`);
      }
      pending.push({ resolve, reject });
      sock.write(parts.join(''));
    }),
    close: () => sock.destroy(),
  };
}

/** p-th percentile (0..100) of numbers, nearest-rank. */
export function percentile(values, p) {
  const v = [...values].sort((a, b) => a - b);
  if (!v.length) return NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * v.length));
  return v[Math.min(rank, v.length) - 1];
}

/**
 * An ExternalScaler client with its own TCP connection: grpc-js shares
 * connections between clients with equal options unless told not to.
 */
export function separateConnectionClient(address) {
  const { grpc, ExternalScaler } = loadGrpc();
  return new ExternalScaler(address, grpc.credentials.createInsecure(),
    { 'grpc.use_local_subchannel_pool': 1 });
}

/** Promise wrapper for a unary call on a raw grpc-js client. */
export function unary(client, method, req, deadlineMs = 10000) {
  const { grpc } = loadGrpc();
  return new Promise((resolve, reject) => {
    client[method](req, new grpc.Metadata(), { deadline: Date.now() + deadlineMs },
      (err, res) => (err ? reject(err) : resolve(res)));
  });
}

/** grpc.status number to name, for messages. */
export function statusName(code) {
  const { grpc } = loadGrpc();
  return Object.keys(grpc.status).find((k) => grpc.status[k] === code) ?? String(code);
}
