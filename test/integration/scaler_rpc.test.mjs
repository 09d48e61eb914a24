// thaw-scaler's gRPC surface against real clients: every RPC of
// externalscaler.ExternalScaler and grpc.health.v1.Health through grpc-js,
// every error path (metadata, protobuf, unknown methods, oversized messages,
// wrong content-type through node:http2, garbage on raw sockets), load:
// 200 concurrent calls over 20 connections, 500 open streams, and uploads
// that announce big messages and stall (memory bounded, streams reset).
//
// Peers are real: a redis-server (queue lengths, wake messages) and a
// prometheus with no scrape targets (its empty answer is a valid one, so the
// scaler's sources are all healthy).
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import net from 'node:net';
import { after, before, test } from 'node:test';

import {
  loadGrpc, REDIS_CLI, spawnProcess, startPrometheus, startRedis, tcpKeepalive, waitUntil,
} from './lib/harness.mjs';
import {
  deadUrl, firstGoawayCode, getDesired, respConnect, sampleValue, scaledObjectRef, separateConnectionClient, sleep,
  startScaler, statusName, unary, waitDesired,
} from './lib/scaler_env.mjs';
import { rssKiB, underSanitizer, underValgrind } from './faults_lib.mjs';

let redis;
let prom;
let scaler;
let grpcStatus;

before(async () => {
  [redis, prom] = await Promise.all([startRedis(), startPrometheus({ scrapeTargets: [] })]);
  scaler = await startScaler({ prometheusUrl: prom.url, redisUrl: redis.url });
  grpcStatus = scaler.client.grpc.status;
  await scaler.client.waitForReady(5000);
});

after(async () => {
  if (scaler) {
    const code = await scaler.stop();
    assert.equal(code, 0, `thaw-scaler exit code; output:\n${scaler.proc.output().slice(-3000)}`);
  }
});

/** Asserts that promise rejects with gRPC status `code` and details matching re. */
async function rejectsWith(promise, code, re, what = '') {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `${what}: expected ${statusName(code)}, the call succeeded`);
  assert.equal(err.code, code,
    `${what}: expected ${statusName(code)}, got ${statusName(err.code)} (${err.details})`);
  if (re) assert.match(err.details, re, `${what}: details`);
  return err;
}

async function streamsOpen() {
  return sampleValue(await scaler.metrics(), 'thaw_scaler_active_streams');
}

test('Health/Check: "" and the scaler service are SERVING, others NOT_FOUND', async () => {
  const c = scaler.client;
  assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
  assert.deepEqual(await c.healthCheck('externalscaler.ExternalScaler'), { status: 'SERVING' });
  await rejectsWith(c.healthCheck('no.such.Service'), grpcStatus.NOT_FOUND, /unknown service/,
    'Check(no.such.Service)');
  await rejectsWith(c.healthCheck('externalscaler.ExternalScalerX'), grpcStatus.NOT_FOUND, null,
    'Check(prefix match)');
});

test('gRPC connections get TCP keepalive after 15 s idle, as Go servers do: a vanished KEDA is found', async () => {
  await scaler.client.waitForReady(5000); // the shared client's connection is open
  const socks = await tcpKeepalive(scaler.proc.pid, scaler.grpcPort, 'local');
  for (const s of socks) {
    assert.ok(s.keepaliveInSeconds !== null && s.keepaliveInSeconds <= 15,
      `keepalive probe due within 15 s (Linux's default is 2 h): ${s.line}`);
  }
});

test('GetMetricSpec: one metric named after the model, targetSize 1 and 1.0', async () => {
  const c = scaler.client;
  const res = await c.getMetricSpec(scaledObjectRef('spec-so', { model: 'rpc-spec' }));
  assert.deepEqual(res, {
    metricSpecs: [{ metricName: 'thaw-rpc-spec', targetSize: 1, targetSizeFloat: 1 }],
  });
  // Characters outside [a-z0-9-] become '-', upper case is lowered.
  const odd = await c.getMetricSpec(scaledObjectRef('spec-odd', { model: 'Llama-3.1/8B_Instruct' }));
  assert.equal(odd.metricSpecs.length, 1);
  assert.equal(odd.metricSpecs[0].metricName, 'thaw-llama-3-1-8b-instruct');
  assert.equal(odd.metricSpecs[0].targetSizeFloat, 1);
});

test('IsActive, StreamIsActive and GetMetrics (int and float) follow a Redis list', async () => {
  const c = scaler.client;
  const ref = scaledObjectRef('rpc-q-so', { model: 'rpc-q', targetQueueLength: '10' });
  assert.deepEqual(await c.isActive(ref), { result: false });
  assert.deepEqual(await getDesired(c, ref),
    { value: 0, valueFloat: 0, metricName: 'thaw-rpc-q' });
  // The request's metric name is echoed (KEDA strips its s<N>- prefix first).
  const named = await c.getMetrics({ scaledObjectRef: ref, metricName: 'thaw-rpc-q' });
  assert.equal(named.metricValues[0].metricName, 'thaw-rpc-q');

  const stream = c.streamIsActive(ref);
  try {
    await sleep(500);
    assert.equal(stream.messages.length, 0, 'an inactive model gets no message on open');
    assert.equal(stream.error, null);

    await redis.cli('LPUSH', 'thaw:queue:rpc-q', ...Array.from({ length: 35 }, (_, i) => `job${i}`));
    const d = await waitDesired(c, ref, 4, 5000);
    assert.deepEqual(d, { value: 4, valueFloat: 4, metricName: 'thaw-rpc-q' });
    assert.deepEqual(await c.isActive(ref), { result: true });
    const on = await stream.waitFor((m) => m.result === true, 3000);
    assert.equal(on.index, 0, 'the first pushed message is true');

    // A second stream opened while active gets true at once.
    const late = c.streamIsActive(ref);
    try {
      await late.waitFor((m) => m.result === true, 2000);
    } finally {
      late.cancel();
    }

    await redis.cli('DEL', 'thaw:queue:rpc-q');
    await waitDesired(c, ref, 0, 5000);
    assert.deepEqual(await c.isActive(ref), { result: false });
    await stream.waitFor((m) => m.result === false, 3000, { since: on.index + 1 });
    assert.equal(stream.error, null);
  } finally {
    stream.cancel();
  }
});

test('metadata errors: INVALID_ARGUMENT naming the key, on every RPC', async () => {
  const c = scaler.client;
  const IA = grpcStatus.INVALID_ARGUMENT;
  const calls = {
    IsActive: (ref) => c.isActive(ref),
    GetMetricSpec: (ref) => c.getMetricSpec(ref),
    GetMetrics: (ref) => c.getMetrics({ scaledObjectRef: ref, metricName: '' }),
    StreamIsActive: (ref) => new Promise((resolve, reject) => {
      const s = c.streamIsActive(ref);
      s.waitFor(() => true, 5000).then(() => { s.cancel(); resolve(); }, reject);
    }),
  };
  for (const [rpc, call] of Object.entries(calls)) {
    await rejectsWith(call({ name: 'x', namespace: 'default', scalerMetadata: {} }), IA,
      /'model'/, `${rpc} without model`);
    await rejectsWith(call(scaledObjectRef('x', { model: '' })), IA, /'model'/, `${rpc} empty model`);
    await rejectsWith(call(scaledObjectRef('x', { model: 'm', targetTokensPerSecond: 'abc' })), IA,
      /'targetTokensPerSecond'.*abc/, `${rpc} targetTokensPerSecond=abc`);
  }
  const bad = {
    targetTokensPerSecond: ['abc', '-5', '0', '', '1e999', 'nan', '12x'],
    targetQueueLength: ['ten', '0', '-1', 'inf'],
    activationTokenRate: ['x', '-0.5', 'NaN'],
    activationQueueLength: ['1,5', '-3', ''],
  };
  for (const [key, values] of Object.entries(bad)) {
    for (const v of values) {
      const e = await rejectsWith(c.isActive(scaledObjectRef('x', { model: 'm', [key]: v })), IA,
        new RegExp(`'${key}'`), `IsActive ${key}=${JSON.stringify(v)}`);
      assert.doesNotMatch(e.details, /'model'/);
    }
  }
  await rejectsWith(c.isActive(scaledObjectRef('x', { model: 'm', redisKey: '' })), IA,
    /'redisKey'/, 'empty redisKey');
  await rejectsWith(c.isActive(scaledObjectRef('x', { model: 'a\nb' })), IA,
    /control characters/, 'model with a newline');
  await rejectsWith(c.getMetrics({ metricName: 'thaw-m' }), IA, /scaledObjectRef/,
    'GetMetrics without scaledObjectRef');

  // Good numbers, zero activation thresholds and KEDA's own keys are accepted.
  const ok = scaledObjectRef('rpc-ok-so', {
    model: 'rpc-ok', targetTokensPerSecond: '250.5', targetQueueLength: ' 3', activationTokenRate: '0',
    activationQueueLength: '0', enableTLS: 'false', unsafeSsl: 'false', metricType: 'AverageValue',
  });
  assert.deepEqual(await c.isActive(ok), { result: false });
  const entry = await scaler.model('rpc-ok-so');
  assert.ok(entry, 'the target shows in /models');
  assert.deepEqual(entry.targets, {
    tokensPerSecond: 250.5, queueLength: 3, activationTokenRate: 0, activationQueueLength: 0,
  });

  // Unknown keys are accepted and logged once.
  const mark = scaler.proc.mark();
  const odd = scaledObjectRef('rpc-odd-so', { model: 'rpc-ok', someUnknownKey: '1' });
  await c.isActive(odd);
  await c.isActive(odd);
  await c.getMetricSpec(odd);
  await scaler.proc.waitForLog(/event=metadata_unknown_key key="?someUnknownKey/, 2000, { since: mark });
  await sleep(200);
  const lines = scaler.proc.lines.slice(mark).filter((l) => /metadata_unknown_key/.test(l.line));
  assert.equal(lines.length, 1, `logged once: ${lines.map((l) => l.line).join('\n')}`);
});

test('bad protobuf bytes: INVALID_ARGUMENT on every method', async () => {
  const c = scaler.client;
  const IA = grpcStatus.INVALID_ARGUMENT;
  const garbage = [
    Buffer.from([0x0a, 0x05, 0x61]),             // length 5, 1 byte follows
    Buffer.from([0x0f, 0x01]),                    // wire type 7 does not exist
    Buffer.from([0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f]), // map entry longer than the message
    Buffer.from([0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]), // varint > 10 bytes
  ];
  const paths = [
    ['/externalscaler.ExternalScaler/IsActive', /ScaledObjectRef/],
    ['/externalscaler.ExternalScaler/StreamIsActive', /ScaledObjectRef/],
    ['/externalscaler.ExternalScaler/GetMetricSpec', /ScaledObjectRef/],
    ['/externalscaler.ExternalScaler/GetMetrics', /GetMetricsRequest/],
    ['/grpc.health.v1.Health/Check', /HealthCheckRequest/],
  ];
  for (const [p, re] of paths) {
    for (const bytes of garbage) {
      await rejectsWith(c.unaryRaw(p, bytes), IA, re, `${p} <- ${bytes.toString('hex')}`);
    }
  }
  // An empty message is a valid ScaledObjectRef without metadata.
  await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/IsActive', Buffer.alloc(0)), IA,
    /'model'/, 'empty IsActive request');
  // And valid bytes work through the same path: Health with service "".
  const raw = await c.unaryRaw('/grpc.health.v1.Health/Check', Buffer.alloc(0));
  assert.deepEqual([...raw], [0x08, 0x01], 'HealthCheckResponse{status: SERVING}');
});

/** Protobuf bytes of a length-delimited field. */
function pbField(num, bytes) {
  const varint = (v) => { const o = []; for (;;) { const b = v & 127; v >>>= 7; if (v) o.push(b | 128); else { o.push(b); return Buffer.from(o); } } };
  const b = Buffer.from(bytes);
  return Buffer.concat([varint((num << 3) | 2), varint(b.length), b]);
}

/** A ScaledObjectRef's bytes; name, namespace and metadata as raw bytes. */
function rawRef(name, ns, metadata) {
  return Buffer.concat([pbField(1, name), pbField(2, ns),
    ...metadata.map(([k, v]) => pbField(3, Buffer.concat([pbField(1, k), pbField(2, v)])))]);
}

test('strings that are not UTF-8, or hold NUL: INVALID_ARGUMENT, and /models and /metrics stay valid', async () => {
  const c = scaler.client;
  const IA = grpcStatus.INVALID_ARGUMENT;
  const bad = Buffer.from([0xff, 0xfe]);
  const overlong = Buffer.from([0xc0, 0xaf]); // '/' in two bytes
  const surrogate = Buffer.from([0xed, 0xa0, 0x80]);
  const good = [['model', Buffer.from('rpc-utf8')], ['policy', Buffer.from('v1')]];
  const isActive = '/externalscaler.ExternalScaler/IsActive';
  const cases = [
    [rawRef('u8', 'default', [['model', bad], ['policy', 'v1']]), /metadata key 'model': value is not valid UTF-8/],
    [rawRef('u8', 'default', [['model', overlong]]), /value is not valid UTF-8/],
    [rawRef('u8', 'default', [...good, ['x', surrogate]]), /metadata key 'x': value is not valid UTF-8/],
    [rawRef('u8', 'default', [...good, [bad, 'y']]), /a metadata key is not valid UTF-8/],
    [rawRef(bad, 'default', good), /name or namespace is not valid UTF-8/],
    [rawRef('u8', surrogate, good), /name or namespace is not valid UTF-8/],
    // NUL is UTF-8, but protobuf-c's C strings would end there: "5\0junk"
    // read as 5, "a\0one" and "a\0two" as the one model "a".
    [rawRef('u8', 'default', [...good, ['targetQueueLength', Buffer.from('5\0junk')]]), /holds a NUL byte/],
    [rawRef('u8', 'default', [['model', Buffer.from('a\0one')], ['policy', 'v1']]), /holds a NUL byte/],
    [rawRef(Buffer.from('u8\0x'), 'default', good), /holds a NUL byte/],
    // A target is namespace/name/model: 'a/b' + 'm' would be 'a' + 'b/m'.
    [rawRef('a/b', 'default', good), /non-empty and hold no '\/'/],
    [rawRef('u8', 'de/fault', good), /non-empty and hold no '\/'/],
    [rawRef('', 'default', good), /non-empty and hold no '\/'/],
    [rawRef('u8', '', good), /non-empty and hold no '\/'/],
  ];
  for (const [bytes, re] of cases) {
    for (const method of ['IsActive', 'GetMetricSpec', 'StreamIsActive']) {
      await rejectsWith(c.unaryRaw(`/externalscaler.ExternalScaler/${method}`, bytes), IA, re,
        `${method} <- ${bytes.toString('hex')}`);
    }
    await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/GetMetrics', pbField(1, bytes)), IA, re,
      `GetMetrics <- ${bytes.toString('hex')}`);
  }
  // GetMetrics echoes metricName in its reply: KEDA's decoder refuses a bad one.
  const okRef = rawRef('u8-ok', 'default', good);
  await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/GetMetrics',
    Buffer.concat([pbField(1, okRef), pbField(2, bad)])), IA, /metricName is not valid UTF-8/, 'metricName');
  await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/GetMetrics',
    Buffer.concat([pbField(1, okRef), pbField(2, Buffer.from('thaw-a\0b'))])), IA, /holds a NUL byte/,
  'metricName with NUL');
  // Multi-byte UTF-8 is fine everywhere.
  const utf8Ref = rawRef('modèle-é', 'default', [['model', Buffer.from('rpc-ünï-コード')], ['policy', Buffer.from('v1')]]);
  assert.ok((await c.unaryRaw(isActive, utf8Ref)).length >= 0);
  const models = await scaler.get('/models');
  assert.equal(models.status, 200, models.text);
  assert.ok(JSON.parse(models.text).some((e) => e.model === 'rpc-ünï-コード'));
  const raw = Buffer.from(await (await fetch(`${scaler.httpBase}/metrics`)).arrayBuffer());
  const text = new TextDecoder('utf-8', { fatal: true }).decode(raw); // throws on a bad byte
  assert.match(text, /model="rpc-ünï-コード"/);
  assert.ok(!(await scaler.models()).some((e) => e.scaledObject === 'u8'), 'no target from a refused call');
});

test('unknown methods and StreamMetricSpec: UNIMPLEMENTED', async () => {
  const c = scaler.client;
  for (const p of ['/externalscaler.ExternalScaler/StreamMetricSpec',
    '/externalscaler.ExternalScaler/NoSuchMethod', '/grpc.health.v1.Health/Watch',
    '/other.Service/IsActive', '/externalscaler.ExternalScaler/isactive']) {
    await rejectsWith(c.unaryRaw(p, Buffer.alloc(0)), grpcStatus.UNIMPLEMENTED, null, p);
  }
});

test('a message over 4 MiB: RESOURCE_EXHAUSTED, and the server still answers', async () => {
  const c = scaler.client;
  const limit = 4 * 1024 * 1024;
  const over = Buffer.alloc(limit + 1, 0x61);
  await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/IsActive', over, { deadlineMs: 15000 }),
    grpcStatus.RESOURCE_EXHAUSTED, /larger than the limit of 4194304 bytes/, 'IsActive with 4 MiB + 1');

  // Exactly at the limit the message is read and parsed: a ScaledObjectRef
  // {name: <long>, scalerMetadata: {model: x}} whose name is too long.
  const mapEntry = Buffer.from([0x1a, 0x0a, 0x0a, 0x05, ...Buffer.from('model'), 0x12, 0x01, 0x78]);
  const nameLen = limit - mapEntry.length - 5;   // tag + 4-byte varint
  assert.ok(nameLen >= 1 << 21 && nameLen < 1 << 28, 'the length takes a 4-byte varint');
  const varint = Buffer.from([(nameLen & 0x7f) | 0x80, ((nameLen >> 7) & 0x7f) | 0x80,
    ((nameLen >> 14) & 0x7f) | 0x80, (nameLen >> 21) & 0x7f]);
  const exact = Buffer.concat([Buffer.from([0x0a]), varint, Buffer.alloc(nameLen, 0x62), mapEntry]);
  assert.equal(exact.length, limit);
  await rejectsWith(c.unaryRaw('/externalscaler.ExternalScaler/IsActive', exact, { deadlineMs: 15000 }),
    grpcStatus.INVALID_ARGUMENT, /too long/, 'IsActive with exactly 4 MiB');

  // The typed client too: 6 MiB of scalerMetadata.
  const huge = scaledObjectRef('huge', { model: 'rpc-huge', pad: 'z'.repeat(6 * 1024 * 1024) });
  await rejectsWith(c.isActive(huge, { deadlineMs: 15000 }), grpcStatus.RESOURCE_EXHAUSTED, /larger than the limit/,
    'IsActive with 6 MiB');

  // Same connection, then a new one: still served.
  assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
  const fresh = separateConnectionClient(scaler.address);
  try {
    const r = await unary(fresh, 'IsActive', scaledObjectRef('after-big', { model: 'rpc-after' }));
    assert.deepEqual(r, { result: false });
  } finally {
    fresh.close();
  }
  assert.equal(scaler.proc.exitCode, null, 'the scaler is still running');
});

/** One request over node:http2; resolves to {headers, trailers, body}. */
function h2Request(session, headers, body) {
  return new Promise((resolve, reject) => {
    const req = session.request(headers);
    const out = { headers: null, trailers: null, body: Buffer.alloc(0) };
    req.on('response', (h) => { out.headers = h; });
    req.on('trailers', (t) => { out.trailers = t; });
    req.on('data', (d) => { out.body = Buffer.concat([out.body, d]); });
    req.on('end', () => resolve(out));
    req.on('error', reject);
    req.setTimeout(5000, () => reject(new Error('h2 request timed out')));
    req.end(body);
  });
}

test('wrong content-type: HTTP 415; GET: 405; the connection keeps serving', async () => {
  const session = http2.connect(`http://127.0.0.1:${scaler.grpcPort}`);
  session.on('error', () => {});
  try {
    const framed = Buffer.from([0, 0, 0, 0, 0]);   // one empty message
    const base = { ':method': 'POST', ':path': '/grpc.health.v1.Health/Check', te: 'trailers' };
    for (const ct of ['application/json', 'text/plain', 'application/grpcx', 'application/grp',
      'application/grpc+json', 'application/grpc+protobuf']) {
      const r = await h2Request(session, { ...base, 'content-type': ct }, framed);
      assert.equal(r.headers[':status'], 415, `content-type ${ct}`);
    }
    const noCt = await h2Request(session, { ...base }, framed);
    assert.equal(noCt.headers[':status'], 415, 'no content-type');
    const get = await h2Request(session,
      { ':method': 'GET', ':path': '/grpc.health.v1.Health/Check', 'content-type': 'application/grpc' });
    assert.equal(get.headers[':status'], 405, 'GET');

    for (const ct of ['application/grpc', 'application/grpc+proto', 'application/grpc;charset=utf-8',
      'application/grpc+proto;charset=utf-8']) {
      const ok = await h2Request(session, { ...base, 'content-type': ct }, framed);
      assert.equal(ok.headers[':status'], 200, `content-type ${ct}`);
      assert.equal(ok.headers['content-type'], 'application/grpc');
      assert.deepEqual([...ok.body], [0, 0, 0, 0, 2, 0x08, 0x01], 'framed SERVING');
      assert.equal(ok.trailers?.['grpc-status'], '0', `trailers ${JSON.stringify(ok.trailers)}`);
    }
    // Two messages in one unary request: an error status, not a crash.
    const two = await h2Request(session, { ...base, 'content-type': 'application/grpc' },
      Buffer.concat([framed, framed]));
    const st = two.trailers?.['grpc-status'] ?? two.headers['grpc-status'];
    assert.equal(st, String(grpcStatus.INTERNAL), 'two request messages');
    // No message at all.
    const none = await h2Request(session, { ...base, 'content-type': 'application/grpc' });
    assert.equal(none.headers['grpc-status'] ?? none.trailers?.['grpc-status'],
      String(grpcStatus.INTERNAL), 'no request message');
    // A compressed message: UNIMPLEMENTED, saying what the server takes
    // (gRPC's compression spec), so a client can retry uncompressed.
    const gz = await h2Request(session, { ...base, 'content-type': 'application/grpc', 'grpc-encoding': 'gzip' },
      Buffer.from([1, 0, 0, 0, 2, 0x1f, 0x8b]));
    assert.equal(gz.headers['grpc-status'] ?? gz.trailers?.['grpc-status'],
      String(grpcStatus.UNIMPLEMENTED), 'compressed request');
    assert.equal(gz.headers['grpc-accept-encoding'], 'identity', `headers ${JSON.stringify(gz.headers)}`);
  } finally {
    session.close();
  }
});

/** Connects a raw TCP socket; resolves once connected. */
function rawSocket() {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port: scaler.grpcPort, host: '127.0.0.1' });
    s.closedP = new Promise((r) => s.on('close', r));
    s.received = Buffer.alloc(0);
    s.on('data', (d) => { s.received = Buffer.concat([s.received, d]); });
    s.on('error', () => {});
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

async function closesWithin(sock, ms) {
  const t = await Promise.race([sock.closedP.then(() => 'closed'), sleep(ms).then(() => 'open')]);
  return t === 'closed';
}

test('garbage bytes and a truncated preface neither crash nor stall the server', async () => {
  const c = scaler.client;
  // Held open for the whole test: a client that stopped mid-preface.
  const truncated = await rawSocket();
  truncated.write('PRI * HTTP/2.0\r\n\r\nS');
  // A client that stopped in the middle of a frame header after a good preface.
  const midFrame = await rawSocket();
  midFrame.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
    Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]), Buffer.from([0, 0, 0x20, 1])]));

  try {
    assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' }, 'served with stalled peers');

    const http1 = await rawSocket();
    http1.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.ok(await closesWithin(http1, 3000), 'an HTTP/1.1 request gets the connection closed');
    // nghttp2 queues no GOAWAY for a bad preface; the server adds one.
    assert.equal(firstGoawayCode(http1.received), http2.constants.NGHTTP2_PROTOCOL_ERROR,
      `GOAWAY PROTOCOL_ERROR; got ${http1.received.toString('hex').slice(0, 120)}`);

    const random = await rawSocket();
    const junk = Buffer.alloc(4096);
    for (let i = 0; i < junk.length; i++) junk[i] = (i * 7919 + 13) & 0xff;
    random.write(junk);
    assert.ok(await closesWithin(random, 3000), 'random bytes get the connection closed');

    // Good preface, then a SETTINGS frame with a length that is not a multiple of 6.
    const badFrame = await rawSocket();
    badFrame.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
      Buffer.from([0, 0, 5, 4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5])]));
    assert.ok(await closesWithin(badFrame, 3000), 'a malformed frame gets the connection closed');
    // The server said why: a GOAWAY frame after its SETTINGS.
    assert.equal(firstGoawayCode(badFrame.received), http2.constants.NGHTTP2_FRAME_SIZE_ERROR,
      `GOAWAY FRAME_SIZE_ERROR; got ${badFrame.received.toString('hex').slice(0, 120)}`);

    // Many at once, while calls are running.
    const storm = await Promise.all(Array.from({ length: 30 }, () => rawSocket()));
    storm.forEach((s, i) => s.write(i % 2 ? junk.subarray(0, 100 + i) : 'PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n'));
    const calls = await Promise.all(Array.from({ length: 20 },
      () => c.isActive(scaledObjectRef('garbage-ok', { model: 'rpc-garbage' }))));
    assert.ok(calls.every((r) => r.result === false));
    const closed = await Promise.all(storm.map((s) => closesWithin(s, 3000)));
    assert.ok(closed.every(Boolean), `${closed.filter((x) => !x).length} junk connections left open`);

    // The stalled peers did not block anyone, and the process is alive.
    assert.deepEqual(await c.healthCheck('externalscaler.ExternalScaler'), { status: 'SERVING' });
    assert.equal(scaler.proc.exitCode, null);
  } finally {
    truncated.destroy();
    midFrame.destroy();
  }
});

test('200 concurrent unary calls over 20 connections all succeed', async (t) => {
  const clients = Array.from({ length: 20 }, () => separateConnectionClient(scaler.address));
  try {
    await Promise.all(clients.map((cl) => new Promise((resolve, reject) =>
      cl.waitForReady(Date.now() + 5000, (e) => (e ? reject(e) : resolve())))));
    const conns = sampleValue(await scaler.metrics(), 'thaw_scaler_grpc_server_connections');
    assert.ok(conns >= 21, `20 separate connections plus the shared one; server counts ${conns}`);

    await redis.cli('LPUSH', 'thaw:queue:rpc-load', ...Array.from({ length: 21 }, (_, i) => i));
    const ref = (i) => scaledObjectRef(`load-${i % 4}`, { model: 'rpc-load', targetQueueLength: '10' });
    await waitDesired(scaler.client, ref(0), 3, 5000);

    const calls = [];
    for (let i = 0; i < 200; i++) {
      const cl = clients[i % 20];
      switch (i % 3) {
        case 0:
          calls.push(unary(cl, 'IsActive', ref(i)).then((r) => assert.deepEqual(r, { result: true })));
          break;
        case 1:
          calls.push(unary(cl, 'GetMetricSpec', ref(i)).then((r) =>
            assert.equal(r.metricSpecs[0].metricName, 'thaw-rpc-load')));
          break;
        default:
          calls.push(unary(cl, 'GetMetrics', { scaledObjectRef: ref(i), metricName: '' }).then((r) => {
            assert.equal(r.metricValues[0].metricValue, 3);
            assert.equal(r.metricValues[0].metricValueFloat, 3);
          }));
      }
    }
    const t0 = performance.now();
    const results = await Promise.allSettled(calls);
    const failed = results.filter((r) => r.status === 'rejected');
    assert.equal(failed.length, 0, `failures: ${failed.slice(0, 3).map((f) => f.reason?.message).join('; ')}`);
    t.diagnostic(`200 calls in ${(performance.now() - t0).toFixed(1)} ms`);
  } finally {
    for (const cl of clients) cl.close();
  }
});

test('500 open StreamIsActive streams: counted, all woken, all released', async () => {
  await waitUntil(async () => (await streamsOpen()) === 0, 5000, { what: 'no streams open' });
  const ref = scaledObjectRef('many-so', { model: 'rpc-many' });
  const clients = Array.from({ length: 5 }, () => separateConnectionClient(scaler.address));
  const { grpc } = scaler.client;
  const streams = [];
  try {
    for (let i = 0; i < 500; i++) {
      const call = clients[i % 5].StreamIsActive(ref);
      const s = { call, got: [], error: null };
      call.on('data', (m) => s.got.push(m.result));
      call.on('error', (e) => { if (e.code !== grpc.status.CANCELLED) s.error = e; });
      streams.push(s);
    }
    await waitUntil(async () => (await streamsOpen()) === 500, 15000, { what: '500 streams open' });
    assert.ok(streams.every((s) => s.got.length === 0 && !s.error), 'idle model: nothing pushed');

    const pub = await respConnect(redis.port);
    try {
      assert.equal(await pub.command('PUBLISH', 'thaw:wake', 'rpc-many'), 1, 'the scaler subscribes');
    } finally {
      pub.close();
    }
    await waitUntil(() => streams.every((s) => s.got.includes(true)), 5000,
      { what: 'true on all 500 streams' });
    assert.ok(streams.every((s) => !s.error), 'no stream failed');
    const m = await scaler.metrics();
    assert.ok(sampleValue(m, 'thaw_scaler_pushes_total', { cause: 'wake' }) >= 500);
  } finally {
    for (const s of streams) s.call.cancel();
  }
  await waitUntil(async () => (await streamsOpen()) === 0, 10000, { what: 'streams released' });
  for (const cl of clients) cl.close();
  assert.deepEqual(await scaler.client.healthCheck(''), { status: 'SERVING' });
});

test('1 100 StreamIsActive streams on one connection (KEDA: one per push trigger): its other calls still pass', async () => {
  await waitUntil(async () => (await streamsOpen()) === 0, 5000, { what: 'no streams open' });
  const ref = scaledObjectRef('pushers-so', { model: 'rpc-pushers' });
  const client = separateConnectionClient(scaler.address);
  const calls = [];
  try {
    for (let i = 0; i < 1100; i++) {
      const call = client.StreamIsActive(ref);
      call.on('data', () => {});
      call.on('error', () => {});
      calls.push(call);
    }
    await waitUntil(async () => (await streamsOpen()) === 1100, 20000, { what: '1 100 streams open' });
    // With a per-connection limit below the streams, the client queues this
    // call behind them until its deadline.
    const spec = await unary(client, 'GetMetricSpec', ref, 3000);
    assert.equal(spec.metricSpecs[0].metricName, 'thaw-rpc-pushers');
  } finally {
    for (const c of calls) c.cancel();
    await waitUntil(async () => (await streamsOpen()) === 0, 10000, { what: 'streams released' });
    client.close();
  }
});

test('stream churn under a flood of wakes: no stream lost or left behind', async () => {
  await waitUntil(async () => (await streamsOpen()) === 0, 5000, { what: 'no streams open' });
  const ref = scaledObjectRef('churn-so', { model: 'rpc-churn' });
  const clients = Array.from({ length: 4 }, () => separateConnectionClient(scaler.address));
  const { grpc } = scaler.client;
  // The flood comes from its own process: a PUBLISH every millisecond.
  const flood = await spawnProcess(REDIS_CLI, ['-h', '127.0.0.1', '-p', redis.port, '-r', '-1', '-i', '0.001',
    'PUBLISH', 'thaw:wake', 'rpc-churn'], { name: 'wake-flood' });
  const errors = [];
  try {
    await flood.waitForLog(/^1$/, 3000);
    const keep = [];
    for (let round = 0; round < 10; round++) {
      const opened = [];
      for (let i = 0; i < 100; i++) {
        const call = clients[i % 4].StreamIsActive(ref);
        call.on('data', () => {});
        call.on('error', (e) => { if (e.code !== grpc.status.CANCELLED) errors.push(e); });
        opened.push(call);
      }
      await sleep(30);
      // Cancel most at once (some before the server saw them), keep a few.
      opened.forEach((c, i) => (i % 10 === 0 ? keep.push(c) : c.cancel()));
    }
    await waitUntil(async () => (await streamsOpen()) === keep.length, 10000,
      { what: `${keep.length} kept streams open` });
    for (const c of keep) c.cancel();
    await waitUntil(async () => (await streamsOpen()) === 0, 10000, { what: 'all streams released' });
  } finally {
    await flood.stop('SIGTERM', 2000);
    for (const cl of clients) cl.close();
  }
  assert.deepEqual(errors.map((e) => `${statusName(e.code)} ${e.details}`), []);
  const published = flood.stdout.length;
  assert.ok(published >= 100, `wakes published during the churn: ${published}`);
  assert.ok(flood.stdout.every((l) => l === '1'), 'every PUBLISH reached the scaler');
  assert.deepEqual(await scaler.client.healthCheck(''), { status: 'SERVING' });
  assert.equal(scaler.proc.exitCode, null);
});

test('streams of a connection that drops without a goodbye are released', async () => {
  await waitUntil(async () => (await streamsOpen()) === 0, 5000, { what: 'no streams open' });
  const { packageDefinition } = loadGrpc();
  const ser = packageDefinition['externalscaler.ExternalScaler'].StreamIsActive.requestSerialize;
  const msg = ser(scaledObjectRef('drop-so', { model: 'rpc-drop' }));
  const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, msg.length]), msg]);
  const sock = net.connect({ port: scaler.grpcPort, host: '127.0.0.1' });
  const session = http2.connect(`http://127.0.0.1:${scaler.grpcPort}`, { createConnection: () => sock });
  session.on('error', () => {});
  const reqs = [];
  for (let i = 0; i < 20; i++) {
    const req = session.request({ ':method': 'POST', ':path': '/externalscaler.ExternalScaler/StreamIsActive',
      'content-type': 'application/grpc', te: 'trailers' });
    req.on('error', () => {});
    req.end(framed);
    reqs.push(req);
  }
  await waitUntil(async () => (await streamsOpen()) === 20, 5000, { what: '20 raw streams open' });
  sock.destroy();   // TCP FIN with streams open, no RST_STREAM, no GOAWAY
  await waitUntil(async () => (await streamsOpen()) === 0, 5000, { what: 'raw streams released' });

  // Nothing of them is left to push to: a wake for the model and a decision
  // change are harmless.
  const pub = await respConnect(redis.port);
  try {
    assert.equal(await pub.command('PUBLISH', 'thaw:wake', 'rpc-drop'), 1);
  } finally {
    pub.close();
  }
  await scaler.proc.waitForLog(/event=wake model="?rpc-drop"? targets=1/, 2000);
  await redis.cli('LPUSH', 'thaw:queue:rpc-drop', 1, 2, 3);
  await waitDesired(scaler.client, scaledObjectRef('drop-so', { model: 'rpc-drop' }), 1, 5000);
  assert.deepEqual(await scaler.client.healthCheck(''), { status: 'SERVING' });
  assert.equal(scaler.proc.exitCode, null);
});

test('open streams are bounded over all connections: past the limit a new one is refused, and freed ones come back', async () => {
  const small = await startScaler({
    prometheusUrl: await deadUrl('http'),
    redisUrl: await deadUrl('redis'),
    name: 'thaw-scaler-maxstreams',
    flags: { 'max-streams-per-connection': 20 },
  });
  const a = separateConnectionClient(small.address);
  const b = separateConnectionClient(small.address);
  const calls = [];
  try {
    const ref = scaledObjectRef('streams-so', { model: 'rpc-streams' });
    for (let i = 0; i < 20; i++) {
      const call = a.StreamIsActive(ref);
      call.on('data', () => {});
      call.on('error', () => {});
      calls.push(call);
    }
    await waitUntil(async () => sampleValue(await small.metrics(), 'thaw_scaler_grpc_server_streams_open') === 20,
      5000, { what: '20 streams open' });
    // Another connection may not add to them.
    const refused = await unary(b, 'GetMetricSpec', ref, 3000).then(() => null, (err) => err);
    assert.ok(refused, 'a call past the limit is refused');
    assert.equal(statusName(refused.code), 'UNAVAILABLE', `${statusName(refused.code)} ${refused.details}`);
    const m = await small.metrics();
    assert.ok(sampleValue(m, 'thaw_scaler_grpc_server_requests_refused_total', { reason: 'streams_full' }) >= 1);
    await small.proc.waitForLog(/event=grpc_streams_full /, 2000);
    for (const c of calls.splice(0, 5)) c.cancel();
    await waitUntil(async () => sampleValue(await small.metrics(), 'thaw_scaler_grpc_server_streams_open') === 15,
      5000, { what: '5 streams freed' });
    const spec = await unary(b, 'GetMetricSpec', ref, 3000);
    assert.equal(spec.metricSpecs[0].metricName, 'thaw-rpc-streams');
  } finally {
    for (const c of calls) c.cancel();
    a.close();
    b.close();
    assert.equal(await small.stop(), 0);
  }
});

test('--max-connections: extra connections are closed at accept, the others keep working', async () => {
  const small = await startScaler({
    prometheusUrl: await deadUrl('http'),
    redisUrl: await deadUrl('redis'),
    name: 'thaw-scaler-maxconn',
    flags: { 'max-connections': 3 },
  });
  const socks = [];
  const open = () => new Promise((resolve, reject) => {
    const s = net.connect({ port: small.grpcPort, host: '127.0.0.1' });
    s.closedP = new Promise((r) => s.on('close', r));
    s.on('error', () => {});
    s.once('connect', () => {
      // A valid, idle HTTP/2 client: preface and empty SETTINGS.
      s.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]));
      resolve(s);
    });
    s.once('error', reject);
  });
  const isClosed = async (s, ms) =>
    (await Promise.race([s.closedP.then(() => true), sleep(ms).then(() => false)]));
  try {
    for (let i = 0; i < 3; i++) socks.push(await open());
    await waitUntil(async () => sampleValue(await small.metrics(), 'thaw_scaler_grpc_server_connections') === 3,
      3000, { what: '3 connections' });
    const extra = await open();
    assert.equal(await isClosed(extra, 2000), true, 'the 4th connection is closed');
    for (const s of socks) assert.equal(await isClosed(s, 10), false, 'the first 3 stay open');
    const m = await small.metrics();
    assert.equal(sampleValue(m, 'thaw_scaler_grpc_server_connections_rejected_total'), 1);

    // Freeing a slot lets a real client in.
    socks.shift().destroy();
    await waitUntil(async () => sampleValue(await small.metrics(), 'thaw_scaler_grpc_server_connections') === 2,
      3000, { what: 'a slot freed' });
    assert.deepEqual(await small.client.healthCheck('', { deadlineMs: 5000 }), { status: 'SERVING' });
  } finally {
    for (const s of socks) s.destroy();
    assert.equal(await small.stop(), 0);
  }
});

/**
 * Opens a GetMetrics stream on session that announces a message of `declared`
 * bytes, sends `send` bytes of it and never ends. Resolves when the stream
 * closes to {status (grpc-status of a reply, or null), message, rstCode,
 * closedAfterMs}.
 */
function stalledUpload(session, declared, send) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const req = session.request({
      ':method': 'POST', ':path': '/externalscaler.ExternalScaler/GetMetrics',
      'content-type': 'application/grpc', te: 'trailers',
    });
    const out = { status: null, message: null, rstCode: null, closedAfterMs: null };
    const take = (h) => {
      if (h['grpc-status'] !== undefined) {
        out.status = Number(h['grpc-status']);
        out.message = decodeURIComponent(h['grpc-message'] ?? '');
      }
    };
    req.on('response', take);
    req.on('trailers', take);
    req.on('error', () => {}); // the reset is what is measured, below
    req.on('close', () => {
      out.rstCode = req.rstCode;
      out.closedAfterMs = performance.now() - t0;
      resolve(out);
    });
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(declared, 1);
    req.write(prefix);
    if (send > 0) req.write(Buffer.alloc(send, 0x61));
  });
}

test('requests in progress: memory bounded by --max-request-bytes, stalled uploads reset after --request-timeout-seconds', async (t) => {
  const budget = 1 << 20;
  const small = await startScaler({
    prometheusUrl: prom.url, redisUrl: redis.url, name: 'thaw-scaler-budget',
    flags: { 'max-request-bytes': budget, 'request-timeout-seconds': 1 },
  });
  const sessions = [];
  let sampling = true;
  let sampler = Promise.resolve();
  try {
    await small.client.waitForReady(5000);
    const rss0 = rssKiB(small.proc.pid);
    // 4 connections x 16 streams, each announcing 4 MiB and sending 512 KiB
    // of it (one fits the budget alone): 32 MiB offered against 1 MiB.
    let peakKiB = rss0;
    let peakHeld = 0;
    sampler = (async () => {
      while (sampling) {
        peakKiB = Math.max(peakKiB, rssKiB(small.proc.pid));
        const m = await small.metrics();
        peakHeld = Math.max(peakHeld, sampleValue(m, 'thaw_scaler_grpc_server_request_bytes'));
        await sleep(20);
      }
    })();
    const uploads = [];
    for (let i = 0; i < 4; i++) {
      // Node would refuse to queue this much (maxSessionMemory, 10 MB by default).
      const s = http2.connect(`http://127.0.0.1:${small.grpcPort}`, { maxSessionMemory: 1000 });
      s.on('error', () => {});
      sessions.push(s);
      for (let j = 0; j < 16; j++) uploads.push(stalledUpload(s, 4 << 20, 512 << 10));
    }
    let timer;
    const results = await Promise.race([Promise.all(uploads), new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('stalled uploads still open after 10 s')), 10000);
    })]).finally(() => clearTimeout(timer));
    sampling = false;
    await sampler;
    const refused = results.filter((r) => r.status === grpcStatus.RESOURCE_EXHAUSTED);
    t.diagnostic(`RSS ${rss0} -> peak ${peakKiB} KiB; budget held at most ${peakHeld} bytes; ` +
      `${refused.length} of ${results.length} refused over budget`);
    assert.ok(peakHeld <= budget, `held ${peakHeld} bytes, over the ${budget}-byte budget`);
    // Under ASan freed buffers sit in its quarantine: the gauge above is the
    // bound there.
    if (!underSanitizer && !underValgrind) {
      assert.ok(peakKiB - rss0 < 12 * 1024, `RSS grew by ${peakKiB - rss0} KiB for a 1 MiB budget`);
    }
    assert.ok(refused.length >= 48 && refused.length < results.length, `${refused.length} calls refused over budget`);
    for (const r of refused) assert.match(r.message, /requests in progress hold \d+ bytes, the limit is 1048576/);
    // Every stream is gone, reset by the upload timeout (NGHTTP2_CANCEL):
    // the refused ones because they kept uploading after their reply.
    for (const r of results) {
      assert.equal(r.rstCode, http2.constants.NGHTTP2_CANCEL, `stream closed with ${JSON.stringify(r)}`);
      assert.ok(r.closedAfterMs >= 900 && r.closedAfterMs < 5000, `closed after ${r.closedAfterMs} ms`);
    }
    const m = await small.metrics();
    assert.equal(sampleValue(m, 'thaw_scaler_grpc_server_request_bytes'), 0, 'budget given back');
    const overBudget = sampleValue(m, 'thaw_scaler_grpc_server_requests_refused_total', { reason: 'over_budget' });
    const timedOut = sampleValue(m, 'thaw_scaler_grpc_server_requests_refused_total', { reason: 'timeout' });
    assert.equal(overBudget, refused.length);
    assert.equal(timedOut, results.length - refused.length, 'the rest timed out');
    const getMetrics = { method: '/externalscaler.ExternalScaler/GetMetrics' };
    assert.equal(sampleValue(m, 'thaw_scaler_grpc_server_handled_total',
      { ...getMetrics, code: 'DEADLINE_EXCEEDED' }), timedOut);
    assert.match(small.proc.output(), /event=grpc_request_budget_full .*limit_bytes=1048576/);

    // A request that has ended is not timed: a StreamIsActive stream lives on.
    const stream = small.client.streamIsActive(scaledObjectRef('budget-stream', { model: 'rpc-budget' }));
    await waitUntil(async () => sampleValue(await small.metrics(), 'thaw_scaler_active_streams') === 1,
      5000, { what: 'the stream is open' });
    await sleep(2500);
    assert.equal(stream.ended, false, 'the stream outlived the request timeout');
    assert.equal(stream.error, null);
    assert.equal(sampleValue(await small.metrics(), 'thaw_scaler_active_streams'), 1);
    assert.deepEqual(await small.client.isActive(scaledObjectRef('after-flood', { model: 'rpc-budget' })),
      { result: false });
    stream.cancel();
  } finally {
    sampling = false;
    await sampler.catch(() => {});
    for (const s of sessions) s.destroy();
    assert.equal(await small.stop(), 0);
  }
});

test('--max-targets: a call for a new ScaledObject past it gets RESOURCE_EXHAUSTED; known ones are served', async () => {
  const small = await startScaler({
    prometheusUrl: prom.url, redisUrl: redis.url, name: 'thaw-scaler-targets', flags: { 'max-targets': 2 },
  });
  try {
    const c = small.client;
    await c.waitForReady(5000);
    assert.deepEqual(await c.isActive(scaledObjectRef('t1', { model: 'rpc-t1' })), { result: false });
    assert.deepEqual(await c.isActive(scaledObjectRef('t2', { model: 'rpc-t2' })), { result: false });
    await rejectsWith(c.isActive(scaledObjectRef('t3', { model: 'rpc-t3' })), grpcStatus.RESOURCE_EXHAUSTED,
      /keeps 2 ScaledObjects already, its --max-targets; raise it/, 'a third target');
    await rejectsWith(c.getMetricSpec(scaledObjectRef('t1', { model: 'rpc-t3' })), grpcStatus.RESOURCE_EXHAUSTED,
      /--max-targets/, 'a known name with a new model is a new target');
    assert.deepEqual(await c.isActive(scaledObjectRef('t1', { model: 'rpc-t1' })), { result: false });
    const m = await small.metrics();
    assert.equal(sampleValue(m, 'thaw_scaler_targets'), 2);
    assert.equal(sampleValue(m, 'thaw_scaler_targets_max'), 2);
    assert.equal(sampleValue(m, 'thaw_scaler_targets_refused_total'), 2);
    assert.match(small.proc.output(), /event=target_limit namespace=default scaledobject=t3 targets=2 max_targets=2/);
  } finally {
    assert.equal(await small.stop(), 0);
  }
});

/** An HTTP/2 frame. */
function h2Frame(type, flags, streamId, payload) {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(streamId, 5);
  return Buffer.concat([h, payload]);
}

test('pushes wait in one bound per connection: a client that never lets them out loses its streams, not the scaler\'s memory', async (t) => {
  const model = 'rpc-noread';
  const ref = rawRef('noread', 'default', [['model', model], ['policy', 'v1']]);
  const msg = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), ref]);
  msg.writeUInt32BE(ref.length, 1);
  // HPACK literals without indexing: no table state to keep.
  const lit = (n, v) => Buffer.concat([Buffer.from([0, n.length]), Buffer.from(n), Buffer.from([v.length]), Buffer.from(v)]);
  const headers = Buffer.concat([lit(':method', 'POST'), lit(':scheme', 'http'),
    lit(':path', '/externalscaler.ExternalScaler/StreamIsActive'), lit(':authority', 'x'),
    lit('content-type', 'application/grpc'), lit('te', 'trailers')]);
  const streams = 200;
  // Every wake pushed (not once a second per stream), so that the bound is
  // reached in seconds.
  const noread = await startScaler({
    prometheusUrl: prom.url, redisUrl: redis.url, name: 'thaw-scaler-noread', flags: { 'wake-repeat-ms': 0 },
  });
  // SETTINGS_INITIAL_WINDOW_SIZE 0: the scaler may send headers, never data.
  const settings = Buffer.from([0, 4, 0, 0, 0, 0]);
  const frames = [Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), h2Frame(4, 0, 0, settings)];
  for (let i = 0; i < streams; i++) {
    frames.push(h2Frame(1, 4, 1 + 2 * i, headers), h2Frame(0, 1, 1 + 2 * i, msg));
  }
  const before = await noread.metrics();
  const failures0 = sampleValue(before, 'thaw_scaler_push_failures_total');
  const streams0 = sampleValue(before, 'thaw_scaler_active_streams');
  const rss0 = rssKiB(noread.proc.pid);
  const sock = net.connect({ port: noread.grpcPort, host: '127.0.0.1' });
  sock.on('data', () => {});
  sock.on('error', () => {});
  const pub = await respConnect(redis.port);
  try {
    sock.write(Buffer.concat(frames));
    await waitUntil(async () => sampleValue(await noread.metrics(), 'thaw_scaler_active_streams') === streams0 + streams,
      5000, { what: `${streams} streams open` });
    // Each wake queues a 7-byte push on each stream: 1 400 bytes a wake, so
    // the 1 MiB of the connection is full after about 750 wakes.
    const wakes = 3000;
    await Promise.all(Array.from({ length: wakes }, () => pub.command('PUBLISH', 'thaw:wake', model)));
    await waitUntil(async () => sampleValue(await noread.metrics(), 'thaw_scaler_active_streams') === streams0,
      10000, { what: 'every stream of the stuck connection ended' });
    const m = await noread.metrics();
    assert.equal(sampleValue(m, 'thaw_scaler_push_failures_total') - failures0, streams);
    const grew = rssKiB(noread.proc.pid) - rss0;
    t.diagnostic(`${wakes} wakes, ${streams} streams that cannot receive: RSS grew by ${grew} KiB`);
    if (!underSanitizer && !underValgrind) assert.ok(grew < 16 * 1024, `RSS grew by ${grew} KiB`);
    // Other connections are served as before.
    assert.deepEqual(await noread.client.isActive(scaledObjectRef('after-noread', { model: 'rpc-after' })),
      { result: false });
  } finally {
    pub.close();
    sock.destroy();
    assert.equal(await noread.stop(), 0);
  }
});

test('the greeting is a deadline: a preface trickled a byte every 2 s is cut 10 s after accept, like a silent one', async () => {
  const t0 = performance.now();
  const silent = await rawSocket();
  const trickle = await rawSocket();
  const preface = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
  let sent = 0;
  const timer = setInterval(() => { if (sent < preface.length) trickle.write(preface.subarray(sent, ++sent)); }, 2000);
  trickle.write(preface.subarray(0, ++sent));
  try {
    const closedAt = async (s) => { await s.closedP; return performance.now() - t0; };
    const [silentMs, trickleMs] = await Promise.race([
      Promise.all([closedAt(silent), closedAt(trickle)]),
      sleep(15000).then(() => { throw new Error('a greeting outlived 15 s'); }),
    ]);
    for (const [what, ms] of [['silent', silentMs], ['trickled', trickleMs]]) {
      assert.ok(ms >= 9500 && ms < 12000, `${what} connection closed after ${ms.toFixed(0)} ms`);
    }
    assert.ok(sent < preface.length, 'the trickle was still going');
  } finally {
    clearInterval(timer);
    silent.destroy();
    trickle.destroy();
  }
});

test('a request body that is not one whole message: INTERNAL saying which', async () => {
  const session = http2.connect(`http://127.0.0.1:${scaler.grpcPort}`);
  session.on('error', () => {});
  const headers = {
    ':method': 'POST', ':path': '/externalscaler.ExternalScaler/IsActive',
    'content-type': 'application/grpc', te: 'trailers',
  };
  const framed = (len, bytes) => { const h = Buffer.alloc(5); h.writeUInt32BE(len, 1); return Buffer.concat([h, bytes]); };
  try {
    for (const [body, re] of [
      [framed(10, Buffer.from('abc')), /request ended in the middle of a message/],
      [Buffer.from([0, 0]), /request ended in the middle of a message/],
      [Buffer.alloc(0), /expected one request message, got none/],
      [Buffer.concat([framed(0, Buffer.alloc(0)), framed(0, Buffer.alloc(0))]), /expected one request message, got several/],
    ]) {
      const r = await h2Request(session, headers, body);
      const t = r.trailers ?? r.headers;
      assert.equal(Number(t['grpc-status']), grpcStatus.INTERNAL, `${body.toString('hex')}: ${JSON.stringify(t)}`);
      assert.match(decodeURIComponent(t['grpc-message']), re, body.toString('hex'));
    }
  } finally {
    session.close();
  }
});
