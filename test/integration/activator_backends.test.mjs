// thaw-activator backend sets: endpoints file reloaded on change, least
// outstanding requests balancing, per-endpoint concurrency cap, DNS names
// (re-resolved faster while a model waits for its first replica), SIGHUP
// config reload; readiness probes against a raw model server (whole-probe
// deadline, interim 1xx heads, invalid statuses) and the 502s for a status
// outside 100..599 or a close without an answer.
import { spawnSync } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import {
  assert, assertAccounted, complete, freePort, metricSum, request, sleep, startActivator,
  startFakeVllm, subscribe, waitUntil,
} from './activator_lib.mjs';
import { startRedis } from './lib/harness.mjs';

const fast = { probeInitialMs: 5, probeMaxMs: 20 };

function endpointsOf(m, model) {
  const out = {};
  for (const [k, v] of m) {
    const mm = /^thaw_activator_endpoint_requests_total\{model="([^"]+)",endpoint="([^"]+)"\}$/.exec(k);
    if (mm && mm[1] === model) out[mm[2]] = v;
  }
  return out;
}

test('endpoints file: reloaded on change, least outstanding spreads load, empty file goes cold without a wake', async () => {
  const redis = await startRedis();
  const wakes = await subscribe(redis.port, 'thaw:wake');
  const [p1, p2] = [await freePort(), await freePort()];
  const f1 = await startFakeVllm({ model: 'pool', port: p1, tokensPerSecond: 50, waitReady: true });
  const f2 = await startFakeVllm({ model: 'pool', port: p2, tokensPerSecond: 50, waitReady: true });
  const dir = fs.mkdtempSync(path.join((await import('node:os')).tmpdir(), 'thaw-eps-'));
  const eps = path.join(dir, 'endpoints');
  fs.writeFileSync(eps, `# one pod\n127.0.0.1:${p1}\n`);
  const act = await startActivator({ models: [{ name: 'pool', endpointsFile: eps, ...fast }] },
    { redisUrl: redis.url });
  try {
    assert.equal((await complete(act.port, 'pool')).status, 200);
    let m = await act.metrics();
    assert.deepEqual(Object.keys(endpointsOf(m, 'pool')), [`127.0.0.1:${p1}`]);

    fs.writeFileSync(eps, `127.0.0.1:${p1}\n127.0.0.1:${p2}\n`);
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_endpoints',
      { model: 'pool', health: 'healthy' }) === 2, 5000, { what: 'two healthy endpoints' });
    // 20 concurrent slow requests (10 tokens at 50/s): least outstanding
    // gives each endpoint about half.
    const before = endpointsOf(await act.metrics(), 'pool');
    const rs = await Promise.all(Array.from({ length: 20 }, () => complete(act.port, 'pool', { maxTokens: 10 })));
    for (const r of rs) assert.equal(r.status, 200);
    m = await act.metrics();
    const after_ = endpointsOf(m, 'pool');
    const d1 = after_[`127.0.0.1:${p1}`] - (before[`127.0.0.1:${p1}`] ?? 0);
    const d2 = after_[`127.0.0.1:${p2}`] - (before[`127.0.0.1:${p2}`] ?? 0);
    assert.equal(d1 + d2, 20);
    assert.ok(Math.abs(d1 - d2) <= 2, `split ${d1}/${d2}`);

    // Scaled to zero by the operator: the list empties, the model goes cold,
    // and no wake is sent for it.
    const wakesBefore = wakes.messages.length;
    fs.writeFileSync(eps, '');
    await waitUntil(async () => (await act.model('pool')).state === 'cold', 5000, { what: 'cold' });
    await sleep(300);
    assert.equal(wakes.messages.length, wakesBefore);
    // The next request wakes it and waits for an endpoint to appear.
    const pending = complete(act.port, 'pool');
    await wakes.waitFor((x) => x.payload === 'pool', 3000);
    await sleep(200);
    fs.writeFileSync(eps, `127.0.0.1:${p2}\n`);
    const r = await pending;
    assert.equal(r.status, 200);
    assert.ok(r.headers['x-thaw-cold-start-ms'] !== undefined);
    // A bad file is ignored (the old list stays).
    fs.writeFileSync(eps, 'not an endpoint\n');
    await act.proc.waitForLog(/event=endpoints_file_invalid/, 3000);
    assert.equal((await complete(act.port, 'pool')).status, 200);
    await assertAccounted(act);
  } finally {
    await act.stop();
    wakes.close();
    await f1.stop();
    await f2.stop();
    await redis.stop();
  }
});

test('endpoints file replaced by a directory: one warning, the list kept (a directory read as an empty list)', async () => {
  const p1 = await freePort();
  const f1 = await startFakeVllm({ model: 'dirpool', port: p1, waitReady: true });
  const dir = fs.mkdtempSync(path.join((await import('node:os')).tmpdir(), 'thaw-eps-'));
  const eps = path.join(dir, 'endpoints');
  fs.writeFileSync(eps, `127.0.0.1:${p1}\n`);
  const act = await startActivator({ models: [{ name: 'dirpool', endpointsFile: eps, ...fast }] });
  try {
    assert.equal((await complete(act.port, 'dirpool')).status, 200);
    const since = act.proc.mark();
    fs.rmSync(eps);
    fs.mkdirSync(eps);
    await act.proc.waitForLog(/event=endpoints_file_invalid path=\S+ err="not a regular file"/, 3000, { since });
    await sleep(600); // two more polls
    assert.equal(act.proc.lines.slice(since).filter((l) => /endpoints_file_invalid/.test(l.line)).length, 1, 'logged once');
    assert.equal((await act.model('dirpool')).state, 'ready');
    assert.equal((await complete(act.port, 'dirpool')).status, 200);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await f1.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('per-endpoint concurrency cap: requests over the cap wait, none fail', async () => {
  let running = 0;
  let peak = 0;
  const srv = http.createServer((req, res) => {
    if (req.url === '/health') { res.end('ok'); return; }
    running++;
    peak = Math.max(peak, running);
    req.resume();
    setTimeout(() => { running--; res.end('{"ok":true}'); }, 150);
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const port = srv.address().port;
  const act = await startActivator({
    models: [{ name: 'capped', backend: `http://127.0.0.1:${port}`, maxConcurrencyPerEndpoint: 2, ...fast }],
  });
  try {
    const t0 = Date.now();
    const rs = await Promise.all(Array.from({ length: 8 }, () => complete(act.port, 'capped')));
    const dt = Date.now() - t0;
    for (const r of rs) assert.equal(r.status, 200);
    assert.equal(peak, 2, `peak concurrency ${peak}`);
    assert.ok(dt >= 550, `8 requests at 2 at a time took ${dt} ms`);
    await assertAccounted(act);
  } finally {
    await act.stop();
    srv.closeAllConnections();
    await new Promise((r) => srv.close(r));
  }
});

test('concurrency cap on a ready model: Redis says queued, not held (0:<ms>:2:<late-ms>:1, 0 for FIFO, 1 in the backend), a lone request in flight says 0:<ms>:0:<late-ms>:1, and HDEL once all are answered', async () => {
  const redis = await startRedis();
  // A slow backend: completions wait until the test opens the gate (or 10 s
  // pass, so a failed assertion cannot hang the test).
  let gateOpen = true;
  const waiting = [];
  const answer = (res) => { if (!res.writableEnded) res.end('{"ok":true}'); };
  const srv = http.createServer((req, res) => {
    if (req.url === '/health') { res.end('ok'); return; }
    req.resume();
    if (gateOpen) { answer(res); return; }
    waiting.push(res);
    setTimeout(() => answer(res), 10000).unref();
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const port = srv.address().port;
  // capq sends its queue FIFO (late-ms 0); capl late-last after 2 s. Both
  // say so with the queue, so that the scaler need not be told.
  const models = [
    { name: 'capq', value: /^0:\d+:2:0:1$/, alone: /^0:\d+:0:0:1$/ },
    { name: 'capl', value: /^0:\d+:2:2000:1$/, alone: /^0:\d+:0:2000:1$/, lateAfterSeconds: 2 },
  ];
  const act = await startActivator({
    models: models.map(({ name, lateAfterSeconds }) => ({
      name, backend: `http://127.0.0.1:${port}`, maxConcurrencyPerEndpoint: 1, ...fast,
      ...(lateAfterSeconds ? { lateAfterSeconds } : {}),
    })),
  }, { redisUrl: redis.url });
  let rs = [];
  try {
    for (const { name: model, value, alone } of models) {
      const field = () => redis.cli('HGET', `thaw:held:${model}`, 'act-test');
      // Make the model ready first: what waits below waits at the cap, not for a wake.
      assert.equal((await complete(act.port, model)).status, 200);
      assert.equal((await act.model(model)).state, 'ready');
      // The warm-up's peak shows for two 1 s refreshes, then the field goes.
      await waitUntil(async () => (await redis.cli('HEXISTS', `thaw:held:${model}`, 'act-test')) === '0', 5000,
        { what: `${model}: no field after the warm-up request` });
      // A request shorter than the refresh still shows (the interval's peak),
      // or the scaler could call the model idle while it serves such requests.
      assert.equal((await complete(act.port, model, { prompt: 'quick' })).status, 200);
      await waitUntil(async () => alone.test(await field()), 2500,
        { what: `thaw:held:${model}: a finished quick request still shows as ${alone}` });
      await waitUntil(async () => (await redis.cli('HEXISTS', `thaw:held:${model}`, 'act-test')) === '0', 5000,
        { what: `${model}: no field two refreshes after the quick request` });

      gateOpen = false;
      // One request in the backend, none waiting: the scaler's idle signal
      // (idleSignal activators) sees it within the 1 s refresh.
      const first = complete(act.port, model, { prompt: 'alone' });
      await waitUntil(() => waiting.length === 1, 5000, { what: `${model}: the lone request at the backend` });
      await waitUntil(async () => alone.test(await field()), 3000, { what: `thaw:held:${model} matching ${alone}` });
      answer(waiting.shift());
      assert.equal((await first).status, 200);
      await waitUntil(async () => (await redis.cli('HEXISTS', `thaw:held:${model}`, 'act-test')) === '0', 5000,
        { what: `${model}: HDEL once the lone request is answered (two refreshes)` });
      rs = Array.from({ length: 3 }, (_, i) => complete(act.port, model, { prompt: `q${i}` }));
      await waitUntil(() => waiting.length === 1, 5000, { what: `${model}: one request at the backend` });
      await waitUntil(async () => (await act.model(model)).held === 2, 5000, { what: `${model}: two waiting at the cap` });
      // The 1 s refresh writes the count of both (the first one went out at once, as 0:<ms>:1:<late-ms>:1).
      const v = await waitUntil(async () => {
        const x = await field();
        return value.test(x) ? x : null;
      }, 3000, { what: `thaw:held:${model} matching ${value}` });
      const ms = Number(v.split(':')[1]);
      assert.ok(Math.abs(ms - Date.now()) < 5000, `fresh timestamp in ${v}`);
      assert.equal(waiting.length, 1, 'the cap of 1 holds');
      assert.equal((await act.model(model)).state, 'ready');

      gateOpen = true;
      for (const res of waiting.splice(0)) answer(res);
      for (const r of await Promise.all(rs)) assert.equal(r.status, 200, r.body.toString());
      await waitUntil(async () => (await redis.cli('HEXISTS', `thaw:held:${model}`, 'act-test')) === '0', 5000,
        { what: `${model}: HDEL once all three are answered (two refreshes)` });
      assert.equal(metricSum(await act.metrics(), 'thaw_activator_requests_total', { model, outcome: 'ok' }), 6);
    }
    await assertAccounted(act);
  } finally {
    // On a failure, let the requests end before the stop so the assertion is what gets reported.
    gateOpen = true;
    for (const res of waiting.splice(0)) answer(res);
    await Promise.allSettled(rs);
    await act.stop();
    srv.closeAllConnections();
    await new Promise((r) => srv.close(r));
    await redis.stop();
  }
});

// A slow backend for the lateAfterSeconds tests: it records the prompts in the
// order they reach it and answers each only once the gate is open (or after
// 10 s, so a failed assertion cannot hang a test). /health answers 200 while
// isHealthy() says so.
async function gatedBackend({ isHealthy = () => true } = {}) {
  const g = { gateOpen: false, waiting: [], order: [] };
  const answer = (res) => { if (!res.writableEnded) res.end('{"ok":true}'); };
  const srv = http.createServer((req, res) => {
    if (req.url === '/health') { res.statusCode = isHealthy() ? 200 : 503; res.end(); return; }
    const bufs = [];
    req.on('data', (b) => bufs.push(b));
    req.on('end', () => {
      g.order.push(JSON.parse(Buffer.concat(bufs).toString()).prompt);
      if (g.gateOpen) { answer(res); return; }
      g.waiting.push(res);
      setTimeout(() => answer(res), 10000).unref();
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  g.url = `http://127.0.0.1:${srv.address().port}`;
  // Opens the gate and answers everything waiting at it.
  g.release = () => {
    g.gateOpen = true;
    for (const res of g.waiting.splice(0)) answer(res);
  };
  g.close = async () => {
    g.release();
    srv.closeAllConnections();
    await new Promise((r) => srv.close(r));
  };
  return g;
}

test('lateAfterSeconds: at the cap, a request that waited too long goes behind a newer one (0: FIFO)', async () => {
  // One slow backend for two models.
  const be = await gatedBackend();
  const act = await startActivator({
    models: [
      { name: 'late', backend: be.url, maxConcurrencyPerEndpoint: 1, lateAfterSeconds: 1, ...fast },
      { name: 'fifo', backend: be.url, maxConcurrencyPerEndpoint: 1, ...fast },
    ],
  });
  const rs = [];
  try {
    for (const model of ['late', 'fifo']) {
      be.gateOpen = true;
      assert.equal((await complete(act.port, model, { prompt: `${model}-warm` })).status, 200);
      assert.equal((await act.model(model)).state, 'ready');
      be.gateOpen = false;
      be.order.length = 0;
      // a takes the one slot; b waits at the cap and is late 1 s later; c
      // arrives 1.5 s after b and is released well within its own second.
      rs.push(complete(act.port, model, { prompt: 'a' }));
      await waitUntil(() => be.waiting.length === 1, 5000, { what: `${model}: a at the backend` });
      rs.push(complete(act.port, model, { prompt: 'b' }));
      await waitUntil(async () => (await act.model(model)).held === 1, 5000, { what: `${model}: b waiting` });
      await new Promise((r) => setTimeout(r, 1500));
      rs.push(complete(act.port, model, { prompt: 'c' }));
      await waitUntil(async () => (await act.model(model)).held === 2, 5000, { what: `${model}: c waiting` });
      be.release();
      for (const r of await Promise.all(rs.splice(0))) assert.equal(r.status, 200, r.body.toString());
      assert.deepEqual(be.order, model === 'late' ? ['a', 'c', 'b'] : ['a', 'b', 'c'], model);
    }
    // b went late under 'late'; under 'fifo' nothing counts as late.
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_late_released_total', { model: 'late' }), 1);
    assert.equal(metricSum(m, 'thaw_activator_late_released_total', { model: 'fifo' }), 0);
    assert.equal((await act.model('late')).lateReleased, 1);
    await assertAccounted(act);
  } finally {
    // On a failure, let the requests end before the stop so the assertion is what gets reported.
    be.release();
    await Promise.allSettled(rs);
    await act.stop();
    await be.close();
  }
});

// A wake with a one-slot model: a is held, b comes bAfterMs later, the model
// turns ready readyAfterMs after that (a goes to the slot), and c comes
// cAfterMs after a reached the backend. Returns the order the backend saw and
// the activator's count of requests sent late.
async function wakeThenNewer({ lateAfterSeconds, bAfterMs, readyAfterMs, cAfterMs }) {
  let healthy = false;
  const be = await gatedBackend({ isHealthy: () => healthy });
  const act = await startActivator({
    models: [{ name: 'wake', backend: be.url, maxConcurrencyPerEndpoint: 1, lateAfterSeconds, ...fast }],
  });
  const rs = [];
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  try {
    rs.push(complete(act.port, 'wake', { prompt: 'a' }));
    await waitUntil(async () => (await act.model('wake')).held === 1, 5000, { what: 'a held' });
    await sleep(bAfterMs);
    rs.push(complete(act.port, 'wake', { prompt: 'b' }));
    await waitUntil(async () => (await act.model('wake')).held === 2, 5000, { what: 'a and b held' });
    await sleep(readyAfterMs);
    healthy = true;
    await waitUntil(() => be.waiting.length === 1, 5000, { what: 'a released to the one slot' });
    await sleep(cAfterMs);
    rs.push(complete(act.port, 'wake', { prompt: 'c' }));
    await waitUntil(async () => (await act.model('wake')).held === 2, 5000, { what: 'b and c waiting' });
    be.release();
    for (const r of await Promise.all(rs.splice(0))) assert.equal(r.status, 200, r.body.toString());
    const lateReleased = (await act.model('wake')).lateReleased;
    await assertAccounted(act);
    return { order: [...be.order], lateReleased };
  } finally {
    be.release();
    await Promise.allSettled(rs);
    await act.stop();
    await be.close();
  }
}

test('lateAfterSeconds: requests held from the start of a wake are late from its readiness, not from their arrival', async () => {
  // a and b are held 2 s, longer than lateAfterSeconds, while "weights load";
  // c comes within a second of the release: b is not late yet, so it keeps its turn.
  const got = await wakeThenNewer({ lateAfterSeconds: 1, bAfterMs: 0, readyAfterMs: 2000, cAfterMs: 0 });
  assert.deepEqual(got, { order: ['a', 'b', 'c'], lateReleased: 0 });
});

test('lateAfterSeconds: a request held at the end of a wake keeps the wake as its allowance, so a newer one does not pass it', async () => {
  // a starts a wake of about 3 s; b comes 2.5 s into it; c comes 3.3 s after
  // the release. b's clock started at its arrival plus the wake (about 0.5 s
  // before c's), so it is on time (late only 2 s after that) and goes first.
  // Counted from the readiness it would have been late 1.3 s before c came,
  // and c would have gone first.
  const got = await wakeThenNewer({ lateAfterSeconds: 2, bAfterMs: 2500, readyAfterMs: 500, cAfterMs: 3300 });
  assert.deepEqual(got, { order: ['a', 'b', 'c'], lateReleased: 0 });
});

test('DNS backend: a host name resolved by the activator (localhost via /etc/hosts)', async () => {
  const port = await freePort();
  const fv = await startFakeVllm({ model: 'dns', port, waitReady: true });
  const act = await startActivator({
    models: [{ name: 'dns', backend: `http://localhost:${port}`, dnsRefreshSeconds: 0.5, ...fast }],
  });
  try {
    const r = await complete(act.port, 'dns');
    assert.equal(r.status, 200, r.body.toString());
    const model = await act.model('dns');
    assert.ok(model.endpoints.some((e) => e.address === `127.0.0.1:${port}`), JSON.stringify(model));
  } finally {
    await act.stop();
    await fv.stop();
  }
});

/**
 * A DNS server on loopback (UDP) answering A queries for one name with the
 * addresses in `addrs` (empty: NOERROR without an answer, as some resolvers
 * say a headless Service with no ready pod), AAAA with nothing; counts the A
 * queries. `nxdomain`: the name is not there (CoreDNS's answer for that
 * Service); `servfail`: every query of the name fails; `delayMs`: answers
 * that name this late; `dropA`: the next that many A queries of the name get
 * no answer at all (lost packets); `silent`: no query of the name is
 * answered (a resolver that is down). `aTimes`, `aIds`: when each A query
 * came, and its DNS id (the same for a query sent again).
 */
async function startDns(name, port = 0) {
  const sock = dgram.createSocket('udp4');
  const dns = { addrs: [], queries: 0, nxdomain: false, servfail: false, delayMs: 0, dropA: 0, silent: false, closed: false, aTimes: [], aIds: [] };
  sock.on('message', (msg, rinfo) => {
    if (msg.length < 12) return;
    let off = 12;
    const labels = [];
    while (off < msg.length && msg[off] !== 0) {
      labels.push(msg.subarray(off + 1, off + 1 + msg[off]).toString());
      off += msg[off] + 1;
    }
    const qEnd = off + 5; // the zero label, type, class
    if (qEnd > msg.length) return;
    const qtype = msg.readUInt16BE(off + 1);
    const match = labels.join('.').toLowerCase() === name;
    const answers = match && qtype === 1 && !dns.nxdomain && !dns.servfail ? dns.addrs : [];
    if (match && qtype === 1) {
      dns.queries++;
      dns.aTimes.push(performance.now());
      dns.aIds.push(msg.readUInt16BE(0));
      if (dns.dropA > 0) {
        dns.dropA--;
        return;
      }
    }
    if (match && dns.silent) return;
    const head = Buffer.alloc(12);
    head.writeUInt16BE(msg.readUInt16BE(0), 0);
    // QR AA RD RA, and the rcode: NXDOMAIN (3) for other names, SERVFAIL (2) if asked.
    head.writeUInt16BE(!match || dns.nxdomain ? 0x8583 : dns.servfail ? 0x8582 : 0x8580, 2);
    head.writeUInt16BE(1, 4);
    head.writeUInt16BE(answers.length, 6);
    const rrs = answers.map((ip) => {
      const rr = Buffer.alloc(16);
      rr.writeUInt16BE(0xc00c, 0);
      rr.writeUInt16BE(1, 2);
      rr.writeUInt16BE(1, 4);
      rr.writeUInt32BE(0, 6);
      rr.writeUInt16BE(4, 10);
      ip.split('.').forEach((b, i) => { rr[12 + i] = Number(b); });
      return rr;
    });
    const answer = Buffer.concat([head, msg.subarray(12, qEnd), ...rrs]);
    const send = () => { if (!dns.closed) sock.send(answer, rinfo.port, rinfo.address, () => {}); };
    if (match && dns.delayMs > 0) setTimeout(send, dns.delayMs);
    else send();
  });
  await new Promise((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(port, '127.0.0.1', resolve);
  });
  dns.port = sock.address().port;
  // Delayed answers still due when it closes are not sent (the resolver
  // sends a query again after 1 s, so several can be due).
  dns.close = () => new Promise((resolve) => { dns.closed = true; sock.close(resolve); });
  return dns;
}

/**
 * A model served by one fake vLLM on 127.0.0.1, named in its backend URL by
 * host, which a DNS server of its own resolves (re-resolved every 0.2 s);
 * answered once, so ready. stop() stops all three.
 */
async function startDnsModel(host, model) {
  const dns = await startDns(host);
  dns.addrs = ['127.0.0.1'];
  const port = await freePort();
  const fv = await startFakeVllm({ model, port, waitReady: true });
  const act = await startActivator(
    { models: [{ name: model, backend: `http://${host}:${port}`, dnsRefreshSeconds: 0.2, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`] });
  const stop = async () => {
    await act.stop();
    await fv.stop();
    await dns.close();
  };
  try {
    assert.equal((await complete(act.port, model)).status, 200);
  } catch (e) {
    await stop();
    throw e;
  }
  return { dns, port, fv, act, stop };
}

test('DNS backend: a lost query is sent again after 1 s, not libevent\'s 5 s (a wake waits on these lookups)', async () => {
  const dns = await startDns('lost.thaw.test');
  dns.addrs = ['127.0.0.1'];
  dns.dropA = 1;
  const port = await freePort();
  const fv = await startFakeVllm({ model: 'lost', port, waitReady: true });
  const act = await startActivator(
    { models: [{ name: 'lost', backend: `http://lost.thaw.test:${port}`, dnsRefreshSeconds: 30, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`] });
  try {
    await waitUntil(() => dns.aTimes.length >= 2, 8000, { what: 'the A query sent again' });
    assert.equal(dns.aIds[1], dns.aIds[0], 'the same query sent again, not a new lookup');
    const gap = dns.aTimes[1] - dns.aTimes[0];
    // Sent again at the 1 s timeout. With libevent's 5 s, the AAAA answer's
    // 3 s skew gives up on the A query first and the next refresh asks again
    // (dnsRefreshSeconds 30 here): no second query within 8 s.
    assert.ok(gap >= 800 && gap < 2500, `sent again after ${gap.toFixed(0)} ms`);
    await waitUntil(async () => (await act.model('lost')).endpoints?.length === 1, 3000,
      { what: 'the endpoint from the second answer' });
    assert.equal((await complete(act.port, 'lost')).status, 200);
  } finally {
    await act.stop();
    await fv.stop();
    await dns.close();
  }
});

// The activator gets its own /etc/resolv.conf in a mount namespace of its own:
// root and unshare (CI runs as root).
const ownResolvConf = process.getuid?.() === 0 &&
  spawnSync('unshare', ['-m', 'true'], { stdio: 'ignore' }).status === 0;

test('DNS: a resolv.conf without a nameserver means 127.0.0.1, as in glibc, with /etc/hosts still read and one warning',
  { skip: !ownResolvConf && 'needs root and unshare -m' }, async (t) => {
    // What a pod with dnsPolicy None and no dnsConfig nameservers gets.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'thaw-resolv-'));
    const conf = path.join(dir, 'resolv.conf');
    fs.writeFileSync(conf, 'search thaw.test\noptions ndots:1\n');
    let dns;
    try {
      dns = await startDns('local.thaw.test', 53);
    } catch (e) {
      t.skip(`127.0.0.1:53 is taken (${e.code})`);
      return;
    }
    dns.addrs = ['127.0.0.1'];
    let fv1, fv2, act;
    try {
      const [p1, p2] = [await freePort(), await freePort()];
      fv1 = await startFakeVllm({ model: 'viahosts', port: p1, waitReady: true });
      fv2 = await startFakeVllm({ model: 'viadns', port: p2, waitReady: true });
      act = await startActivator({
        models: [
          { name: 'viahosts', backend: `http://localhost:${p1}`, dnsRefreshSeconds: 30, ...fast },
          { name: 'viadns', backend: `http://local.thaw.test:${p2}`, dnsRefreshSeconds: 30, ...fast },
        ],
      }, {
        prefix: ['unshare', '-m', 'sh', '-c', 'mount --bind "$0" /etc/resolv.conf && exec "$@"', conf],
      });
      const warn = await act.proc.waitForLog(/event=dns_resolv_conf_unusable .*nameservers=(\d+)/, 5000);
      assert.equal(warn[1], '1', warn.input);
      assert.equal((await complete(act.port, 'viahosts')).status, 200, 'localhost from /etc/hosts');
      const r = await complete(act.port, 'viadns');
      assert.equal(r.status, 200, r.body.toString());
      assert.ok(dns.queries >= 1, 'the name was asked of 127.0.0.1:53');
    } finally {
      await act?.stop();
      await fv1?.stop();
      await fv2?.stop();
      await dns.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

test('DNS backend, waking: the name is re-resolved every dnsRefreshWakingSeconds until a replica is healthy', async () => {
  const dns = await startDns('m.thaw.test');
  const port = await freePort();
  const fv = await startFakeVllm({ model: 'dnsw', port, waitReady: true });
  // The slow period is 30 s: only the waking one can find the replica in time.
  const act = await startActivator(
    { models: [{ name: 'dnsw', backend: `http://m.thaw.test:${port}`, dnsRefreshSeconds: 30,
      dnsRefreshWakingSeconds: 0.2, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`] });
  try {
    await waitUntil(() => dns.queries >= 1, 5000, { what: 'the first resolution' });
    const pending = complete(act.port, 'dnsw', { timeoutMs: 20000 });
    await waitUntil(async () => (await act.model('dnsw')).held === 1, 5000, { what: 'the request held' });
    await sleep(600);
    const whileWaking = dns.queries;
    assert.ok(whileWaking >= 3, `re-resolved while waking (${whileWaking} queries)`);
    const t0 = Date.now();
    dns.addrs = ['127.0.0.1']; // the replica turns ready: the headless Service lists it
    const r = await pending;
    const noticed = Date.now() - t0;
    assert.equal(r.status, 200, r.body.toString());
    assert.ok(noticed < 5000, `served ${noticed} ms after the name listed the replica`);
    // Ready: back to the slow period (30 s), no more queries for now.
    const afterReady = dns.queries;
    await sleep(1500);
    assert.ok(dns.queries - afterReady <= 1, `${dns.queries - afterReady} queries once ready`);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fv.stop();
    await dns.close();
  }
});

test('DNS backend scaled to zero: a name that is not there (NXDOMAIN), or lists no address (NOERROR), empties the endpoints; the model goes cold', async () => {
  const dns = await startDns('z.thaw.test');
  dns.addrs = ['127.0.0.1'];
  const port = await freePort();
  let fv = await startFakeVllm({ model: 'dnsz', port, waitReady: true });
  const act = await startActivator(
    { models: [{ name: 'dnsz', backend: `http://z.thaw.test:${port}`, dnsRefreshSeconds: 0.2,
      holdTimeoutSeconds: 20, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`] });
  try {
    // libevent 2.1's getaddrinfo reports a NOERROR answer without addresses
    // as it does a SERVFAIL; the activator asks A and AAAA again to tell them
    // apart (the SERVFAIL test below keeps the list).
    for (const how of ['NXDOMAIN', 'NOERROR without addresses', 'NXDOMAIN again']) {
      assert.equal((await complete(act.port, 'dnsz')).status, 200, how);
      assert.equal((await act.model('dnsz')).state, 'ready', how);
      // The replica goes, and the name with it. The old address must not
      // stay healthy: it may be another pod's by now.
      const mark = act.proc.mark();
      await fv.stop();
      if (how.startsWith('NXDOMAIN')) dns.nxdomain = true;
      else dns.addrs = [];
      await act.proc.waitForLog(/event=model_state model=dnsz from=ready to=cold event=endpoints_gone/, 3000,
        { since: mark });
      assert.deepEqual((await act.model('dnsz')).endpoints, [], how);
      await sleep(1000); // five more lookups: one line, not one each
      const lines = act.proc.output().split('\n').slice(mark).filter((l) => /event=dns_/.test(l));
      assert.equal(lines.length, 1, lines.join('\n'));
      assert.match(lines[0], /event=dns_no_addresses host=z.thaw.test/);
      // A request wakes it; the replica comes back under the name.
      const pending = complete(act.port, 'dnsz', { timeoutMs: 20000 });
      await waitUntil(async () => (await act.model('dnsz')).held === 1, 3000, { what: `held (${how})` });
      fv = await startFakeVllm({ model: 'dnsz', port, waitReady: true });
      dns.nxdomain = false;
      dns.addrs = ['127.0.0.1'];
      assert.equal((await pending).status, 200, how);
    }
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fv.stop();
    await dns.close();
  }
});

test('DNS backend, resolver failing (SERVFAIL): the last list is kept, the model stays ready, one log line', async () => {
  const m = await startDnsModel('f.thaw.test', 'dnsf');
  const { dns, act } = m;
  try {
    const mark = act.proc.mark();
    const before = dns.queries;
    dns.servfail = true;
    await act.proc.waitForLog(/event=dns_failed host=f\.thaw\.test .*kept_last_good=true/, 5000, { since: mark });
    await sleep(1000); // several more failed lookups
    assert.ok(dns.queries - before >= 4, `${dns.queries - before} A queries while failing`);
    const model = await act.model('dnsf');
    assert.equal(model.state, 'ready');
    assert.equal(model.endpoints.length, 1, JSON.stringify(model.endpoints));
    assert.equal((await complete(act.port, 'dnsf')).status, 200, 'served from the kept list');
    const lines = act.proc.output().split('\n').slice(mark).filter((l) => /event=(dns_|model_state)/.test(l));
    assert.equal(lines.length, 1, lines.join('\n'));
    dns.servfail = false;
    assert.equal((await complete(act.port, 'dnsf')).status, 200);
    await assertAccounted(act);
  } finally {
    await m.stop();
  }
});

test('DNS backend, resolver silent: each lookup times out after 3 sends about 1 s apart, the last list is kept, the model stays ready', async () => {
  const m = await startDnsModel('t.thaw.test', 'dnst');
  const { dns, act } = m;
  try {
    const mark = act.proc.mark();
    const from = dns.aTimes.length;
    const t0 = performance.now();
    dns.silent = true;
    await act.proc.waitForLog(/event=dns_failed host=t\.thaw\.test .*kept_last_good=true/, 8000, { since: mark });
    const failedAfter = performance.now() - t0;
    // The first lookup sent after going silent: its A query and the two
    // sent again (a refresh may have been under way when it went silent).
    const sends = dns.aTimes.slice(from);
    assert.ok(sends.length >= 3, `${sends.length} A queries`);
    const gap = sends[1] - sends[0];
    assert.ok(gap >= 800 && gap < 2000, `sent again after ${gap.toFixed(0)} ms`);
    assert.ok(failedAfter >= 2500 && failedAfter < 5000, `failed after ${failedAfter.toFixed(0)} ms`);
    const model = await act.model('dnst');
    assert.equal(model.state, 'ready');
    assert.equal(model.endpoints.length, 1, JSON.stringify(model.endpoints));
    assert.equal((await complete(act.port, 'dnst')).status, 200, 'served from the kept list');
    dns.silent = false;
    const lines = act.proc.output().split('\n').slice(mark).filter((l) => /event=(dns_|model_state)/.test(l));
    assert.equal(lines.length, 1, lines.join('\n'));
    await assertAccounted(act);
  } finally {
    await m.stop();
  }
});

test('DNS backend: an answer without addresses that comes after 2 s (a resolver timing out upstream) keeps the list; a prompt one empties it', async () => {
  const m = await startDnsModel('s.thaw.test', 'dnss');
  const { dns, act } = m;
  try {
    const mark = act.proc.mark();
    dns.delayMs = 2500;
    dns.addrs = [];
    await act.proc.waitForLog(/event=dns_failed host=s\.thaw\.test .*kept_last_good=true/, 8000, { since: mark });
    assert.equal((await act.model('dnss')).endpoints.length, 1, 'a slow failure is not asked again');
    dns.delayMs = 0;
    await act.proc.waitForLog(/event=model_state model=dnss from=ready to=cold event=endpoints_gone/, 8000,
      { since: mark });
    assert.match(act.proc.output().split('\n').slice(mark).join('\n'), /event=dns_no_addresses host=s\.thaw\.test/);
    await assertAccounted(act);
  } finally {
    await m.stop();
  }
});

test('DNS backend, rolling update seen in one answer (every address replaced): the new ones are probed, no wake, no cold start', async () => {
  const m = await startDnsModel('r.thaw.test', 'dnsr');
  const { dns, port, act } = m;
  let fv2 = null;
  try {
    const coldStarts = (await act.model('dnsr')).coldStarts;
    fv2 = await startFakeVllm({ model: 'dnsr', port, host: '127.0.0.2', waitReady: true });
    const mark = act.proc.mark();
    dns.addrs = ['127.0.0.2'];
    await act.proc.waitForLog(/event=model_state model=dnsr from=ready to=waking event=endpoints_replaced/, 3000,
      { since: mark });
    await act.proc.waitForLog(/event=model_state model=dnsr from=waking to=ready event=probe_ok/, 3000,
      { since: mark });
    const r = await complete(act.port, 'dnsr');
    assert.equal(r.status, 200);
    const lines = act.proc.output().split('\n').slice(mark);
    assert.deepEqual(lines.filter((l) => /event=wake_signal|to=cold/.test(l)), [], 'no wake, never cold');
    assert.equal((await act.model('dnsr')).coldStarts, coldStarts);
    assert.deepEqual((await act.model('dnsr')).endpoints.map((e) => e.address), [`127.0.0.2:${port}`]);
    await assertAccounted(act);
  } finally {
    await m.stop();
    await fv2?.stop();
  }
});

test('DNS backend: an address that leaves the answer and comes back with requests still running keeps counting them against the cap', async () => {
  const dns = await startDns('c.thaw.test');
  dns.addrs = ['127.0.0.1'];
  const port = await freePort();
  // Slow streams: 60 tokens at 20/s keep a request running for 3 s.
  const fx = await startFakeVllm({ model: 'dnsc', port, waitReady: true, tokensPerSecond: 20 });
  const fz = await startFakeVllm({ model: 'dnsc', port, host: '127.0.0.2', waitReady: true, tokensPerSecond: 20 });
  const act = await startActivator(
    { models: [{ name: 'dnsc', backend: `http://c.thaw.test:${port}`, dnsRefreshSeconds: 0.1,
      maxConcurrencyPerEndpoint: 2, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`] });
  const running = async (f) => {
    const text = (await request(f.port, { host: f === fz ? '127.0.0.2' : '127.0.0.1', path: '/metrics' })).body.toString();
    return Number(/^vllm:num_requests_running\{[^}]*\} (\d+)/m.exec(text)?.[1] ?? NaN);
  };
  const long = () => complete(act.port, 'dnsc', { stream: true, maxTokens: 60, timeoutMs: 30000 });
  try {
    const first = [long(), long()]; // both on X, the one address listed
    await waitUntil(async () => (await running(fx)) === 2, 3000, { what: 'X running 2' });
    const endpoints = async () => (await act.model('dnsc')).endpoints.map((e) => e.address).sort();
    dns.addrs = ['127.0.0.2'];
    await waitUntil(async () => (await endpoints()).join() === `127.0.0.2:${port}`, 3000, { what: 'X retired' });
    dns.addrs = ['127.0.0.1', '127.0.0.2'];
    await waitUntil(async () => (await endpoints()).length === 2, 3000, { what: 'X listed again' });
    await waitUntil(async () => (await act.model('dnsc')).endpoints.every((e) => e.healthy), 3000,
      { what: 'both healthy' });
    // Four more: Z takes two; X is at its cap with the two from before.
    const more = [long(), long(), long(), long()];
    let most = 0;
    for (let i = 0; i < 10; i++) {
      most = Math.max(most, await running(fx));
      await sleep(100);
    }
    assert.ok(most <= 2, `X ran ${most} at once (cap 2)`);
    for (const r of await Promise.all([...first, ...more])) assert.equal(r.status, 200);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fx.stop();
    await fz.stop();
    await dns.close();
  }
});

test('--scaler-wake-url with a name: every address it resolves to (each scaler replica) gets POST /wake', async () => {
  const dns = await startDns('scaler.thaw.test');
  dns.addrs = ['127.0.0.1', '127.0.0.2'];
  const port = await freePort();
  const hits = [];
  const servers = await Promise.all(dns.addrs.map((ip) => new Promise((resolve, reject) => {
    const srv = http.createServer((req, res) => {
      hits.push({ ip, method: req.method, url: req.url });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"targets":1}\n');
    });
    srv.on('error', reject);
    srv.listen(port, ip, () => resolve(srv));
  })));
  dns.addrs = ['127.0.0.1', '127.0.0.2', '127.0.0.1']; // a repeated address: still one post each
  const coldPort = await freePort(); // nothing listens: the model stays cold
  const act = await startActivator(
    { models: [{ name: 'org/m1', backend: `http://127.0.0.1:${coldPort}`, holdTimeoutSeconds: 3, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${dns.port}`, '--scaler-wake-url', `http://scaler.thaw.test:${port}`] });
  try {
    const pending = complete(act.port, 'org/m1', { timeoutMs: 10000 });
    await waitUntil(() => new Set(hits.map((h) => h.ip)).size === 2, 3000, { what: 'both addresses posted' });
    for (const h of hits) {
      assert.equal(h.method, 'POST');
      assert.equal(h.url, '/wake?model=org%2Fm1&instance=act-test&held=1');
    }
    // No Redis: the wake is renewed every second while the request waits.
    await sleep(2000);
    assert.ok(hits.length >= 4, `${hits.length} posts in ~2 s`);
    assert.equal((await pending).status, 504, 'nothing came up: the hold deadline answers');
    await sleep(500); // nothing held: no renewal; the last post's answer is read
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_scaler_wakes_total', { result: 'sent' }), hits.length);
    const per = (ip) => hits.filter((h) => h.ip === ip).length;
    assert.ok(Math.abs(per('127.0.0.1') - per('127.0.0.2')) <= 1, `posts ${per('127.0.0.1')} / ${per('127.0.0.2')}`);
    assert.equal(metricSum(m, 'thaw_activator_scaler_wakes_total', { result: 'failed' }), 0);

    // One replica gone: its post fails and is counted, the other still gets it.
    await new Promise((resolve) => servers[1].close(resolve));
    const before = hits.length;
    const again = complete(act.port, 'org/m1', { timeoutMs: 10000 });
    assert.equal((await again).status, 504);
    await sleep(500);
    assert.ok(metricSum(await act.metrics(), 'thaw_activator_scaler_wakes_total', { result: 'failed' }) >= 1,
      'the refused post counted');
    assert.ok(hits.length > before);
    assert.ok(hits.slice(before).every((h) => h.ip === '127.0.0.1'));
    assert.match(act.proc.output(), /event=scaler_wake_failed addr=127\.0\.0\.2:\d+ reason=connect_or_io_error/);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(() => resolve()))));
    await dns.close();
  }
});

test('--scaler-wake-url that cannot be connected to at all: the post fails at once, not after its timeout', async () => {
  const coldPort = await freePort();
  const act = await startActivator(
    { models: [{ name: 'nowhere', backend: `http://127.0.0.1:${coldPort}`, holdTimeoutSeconds: 1, ...fast }] },
    { args: ['--scaler-wake-url', 'http://255.255.255.255:9', '--scaler-wake-timeout-ms', '5000'] });
  try {
    const t0 = Date.now();
    const pending = complete(act.port, 'nowhere', { timeoutMs: 10000 });
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_scaler_wakes_total',
      { result: 'failed' }) >= 1, 1000, { what: 'the failed post counted' });
    assert.ok(Date.now() - t0 < 1000, 'well before the 5 s post timeout');
    await act.proc.waitForLog(/event=scaler_wake_failed addr=255\.255\.255\.255:9 reason=connect_failed/, 2000);
    assert.equal((await pending).status, 504);
  } finally {
    await act.stop();
  }
});

test('--scaler-wake-timeout-ms is a deadline: a scaler address that trickles a byte at a time does not keep the post', async () => {
  const socks = [];
  const trickle = net.createServer((s) => {
    socks.push(s);
    s.on('error', () => {});
    const t = setInterval(() => s.write('H'), 150);
    s.on('close', () => clearInterval(t));
  });
  await new Promise((resolve) => trickle.listen(0, '127.0.0.1', resolve));
  const coldPort = await freePort();
  const act = await startActivator(
    { models: [{ name: 'trickled', backend: `http://127.0.0.1:${coldPort}`, holdTimeoutSeconds: 2, ...fast }] },
    { args: ['--scaler-wake-url', `http://127.0.0.1:${trickle.address().port}`, '--scaler-wake-timeout-ms', '500'] });
  try {
    const t0 = Date.now();
    const pending = complete(act.port, 'trickled', { timeoutMs: 10000 });
    await act.proc.waitForLog(/event=scaler_wake_failed addr=127\.0\.0\.1:\d+ reason=timeout/, 3000);
    const took = Date.now() - t0;
    assert.ok(took < 1500, `the post ended ${took} ms after it began (deadline 500 ms)`);
    assert.equal((await pending).status, 504);
  } finally {
    await act.stop();
    for (const s of socks) s.destroy();
    trickle.close();
  }
});

test('a wake lookup still pending at shutdown is cancelled and freed (clean exit under ASan)', async () => {
  const silent = dgram.createSocket('udp4'); // a nameserver that never answers
  await new Promise((resolve) => silent.bind(0, '127.0.0.1', resolve));
  const coldPort = await freePort();
  const act = await startActivator(
    { limits: { drainTimeoutSeconds: 0.5 },
      models: [{ name: 'pending', backend: `http://127.0.0.1:${coldPort}`, ...fast }] },
    { args: ['--dns-server', `127.0.0.1:${silent.address().port}`,
      '--scaler-wake-url', 'http://scaler.never.test:9091'] });
  try {
    const pending = complete(act.port, 'pending', { timeoutMs: 10000 });
    await waitUntil(async () => (await act.model('pending')).held === 1, 3000, { what: 'held' });
    await sleep(300); // lookups under way, never answered
    await act.stop(); // exit 0 and, under a sanitizer, no leak report
    assert.equal((await pending).status, 503);
  } finally {
    silent.close();
  }
});

test('SIGHUP reload: models added and changed without dropping connections; a bad file is rejected', async () => {
  const [p1, p2] = [await freePort(), await freePort()];
  const f1 = await startFakeVllm({ model: 'a', port: p1, waitReady: true });
  const f2 = await startFakeVllm({ model: 'b', port: p2, waitReady: true });
  const cfg = { models: [{ name: 'a', backend: `http://127.0.0.1:${p1}`, ...fast }] };
  const act = await startActivator(cfg);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const r1 = await complete(act.port, 'a', { agent });
    assert.equal(r1.status, 200);
    assert.equal((await complete(act.port, 'b')).status, 404);
    act.writeConfig({ models: [...cfg.models, { name: 'b', backend: `http://127.0.0.1:${p2}`, aliases: ['b-*'], ...fast }] });
    const mark = act.proc.mark();
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded models=2/, 3000, { since: mark });
    const r2 = await complete(act.port, 'b', { agent });
    assert.equal(r2.status, 200);
    assert.equal(r2.socket, r1.socket, 'same client connection across the reload');
    assert.equal((await act.model('a')).state, 'ready', 'state kept across the reload');
    // Broken file: rejected, the running config stays.
    fs.writeFileSync(act.configPath, '{"models": [{"name": "a"}]}');
    const mark2 = act.proc.mark();
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=reload_rejected .*models\[0\]/, 3000, { since: mark2 });
    assert.equal((await complete(act.port, 'b', { agent })).status, 200);
    // Removing a model: it stops routing.
    act.writeConfig({ models: [{ name: 'b', backend: `http://127.0.0.1:${p2}`, ...fast }] });
    const mark3 = act.proc.mark();
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded models=1/, 3000, { since: mark3 });
    assert.equal((await complete(act.port, 'a')).status, 404);
    assert.equal((await complete(act.port, 'b')).status, 200);
  } finally {
    agent.destroy();
    await act.stop();
    await f1.stop();
    await f2.stop();
  }
});

test('config file watch: a changed file is reloaded without SIGHUP; a bad one is rejected and the old config stays', async () => {
  const p1 = await freePort();
  const p2 = await freePort();
  const f1 = await startFakeVllm({ model: 'wa', port: p1, waitReady: true });
  const f2 = await startFakeVllm({ model: 'wb', port: p2, waitReady: true });
  const cfg = { models: [{ name: 'wa', backend: `http://127.0.0.1:${p1}`, ...fast }] };
  const act = await startActivator(cfg, { args: ['--config-poll-ms', '100'] });
  try {
    assert.equal((await complete(act.port, 'wa')).status, 200);
    assert.equal((await complete(act.port, 'wb')).status, 404);
    let mark = act.proc.mark();
    fs.writeFileSync(act.configPath, '{"models": [');
    await act.proc.waitForLog(/event=reload_rejected/, 3000, { since: mark });
    assert.equal((await complete(act.port, 'wa')).status, 200, 'the old config stays');
    // A ConfigMap update: a new file renamed over the old one (a new inode).
    mark = act.proc.mark();
    const tmp = `${act.configPath}.new`;
    fs.writeFileSync(tmp, JSON.stringify({ models: [...cfg.models, { name: 'wb', backend: `http://127.0.0.1:${p2}`, ...fast }] }));
    fs.renameSync(tmp, act.configPath);
    await act.proc.waitForLog(/event=config_changed/, 3000, { since: mark });
    await act.proc.waitForLog(/event=config_reloaded models=2/, 3000, { since: mark });
    assert.equal((await complete(act.port, 'wb')).status, 200);
    // Unchanged: no more reloads.
    mark = act.proc.mark();
    await sleep(500);
    assert.ok(!/config_changed/.test(act.proc.output().split('\n').slice(mark).join('\n')), 'reloaded an unchanged file');
    await assertAccounted(act);
  } finally {
    await act.stop();
    await f1.stop();
    await f2.stop();
  }
});

test('bad config: a clear message naming the field, exit non-zero', async () => {
  const { spawnProcess, binPath, tmpDir } = await import('./lib/harness.mjs');
  const dir = tmpDir();
  const file = path.join(dir, 'bad.json');
  fs.writeFileSync(file, JSON.stringify({ models: [{ name: 'x', backend: 'http://h:1', maxHeldRequests: -1 }] }));
  const p = await spawnProcess(binPath('thaw-activator'), ['--config', file, '--listen', '127.0.0.1:0',
    '--admin-listen', '127.0.0.1:0']);
  const code = await p.exited;
  assert.notEqual(code, 0);
  assert.match(p.output(), /models\[0\]\.maxHeldRequests/);
  void request;
});

// A raw-TCP model server, for answers node's http server will not send: a
// /health that trickles its bytes or sends 1xx heads first, statuses outside
// 100..599. health(sock) answers GET /health; answer(sock) every other
// request (after its Content-Length body). Counts /health connections.
async function rawModelServer({ health, answer }) {
  const s = { healthConns: 0, sockets: new Set(), timers: new Set() };
  const server = net.createServer((sock) => {
    s.sockets.add(sock);
    sock.on('close', () => s.sockets.delete(sock));
    sock.on('error', () => {});
    let buf = Buffer.alloc(0);
    const pump = () => {
      const i = buf.indexOf('\r\n\r\n');
      if (i < 0) return;
      const head = buf.subarray(0, i).toString('latin1');
      const cl = /\r\ncontent-length:\s*(\d+)/i.exec(head);
      const end = i + 4 + (cl ? Number(cl[1]) : 0);
      if (buf.length < end) return;
      buf = buf.subarray(end);
      if (head.split(' ')[1] === '/health') { s.healthConns++; health(sock, s); } else answer(sock, s);
    };
    sock.on('data', (d) => { buf = Buffer.concat([buf, d]); pump(); });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  s.url = `http://127.0.0.1:${server.address().port}`;
  // Writes text one byte per everyMs (for as long as the socket is open).
  s.trickle = (sock, text, everyMs) => {
    let i = 0;
    const t = setInterval(() => {
      if (sock.destroyed || i >= text.length) { clearInterval(t); s.timers.delete(t); return; }
      sock.write(text[i++]);
    }, everyMs);
    s.timers.add(t);
  };
  s.close = async () => {
    for (const t of s.timers) clearInterval(t);
    for (const sock of s.sockets) sock.destroy();
    await new Promise((r) => server.close(r));
  };
  return s;
}

const OK_200 = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok';

test('readiness probe: probeTimeoutMs bounds the whole probe, so a /health trickling its answer is given up on and probed again', async () => {
  // While `slow`, /health sends a 200 one byte per 100 ms (about 15 s in
  // all): each byte would restart an idle timeout. Then it answers at once.
  let slow = true;
  const be = await rawModelServer({
    health: (sock, s) => {
      if (slow) s.trickle(sock, `HTTP/1.1 200 OK\r\nX-Pad: ${'a'.repeat(100)}\r\nContent-Length: 2\r\n\r\nok`, 100);
      else sock.end(OK_200);
    },
    answer: (sock) => sock.write('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello'),
  });
  const act = await startActivator({
    models: [{ name: 'trickle', backend: be.url, probeTimeoutMs: 500, holdTimeoutSeconds: 5, ...fast }],
  });
  try {
    setTimeout(() => { slow = false; }, 1200);
    const t0 = Date.now();
    const r = await complete(act.port, 'trickle', { timeoutMs: 10000 });
    const took = Date.now() - t0;
    // Released by the first probe after /health turned quick (~1.2-1.7 s);
    // a per-byte timeout would keep the first probe for ~15 s: 504 at 5 s.
    assert.equal(r.status, 200, r.body.toString());
    assert.ok(took < 3500, `held ${took} ms`);
    assert.ok(be.healthConns >= 3, `${be.healthConns} probes`);
    await act.proc.waitForLog(/event=probe_failed .*reason="probe deadline exceeded/, 1000);
  } finally {
    await act.stop();
    await be.close();
  }
});

test('readiness probe: interim 1xx heads (103, 100) are skipped, bounded; 101 and a status over 599 are not healthy', async () => {
  const early = 'HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n';
  const be = await rawModelServer({
    // 103 alone, then 100 and the 200 in one write: each read is parsed on.
    health: (sock) => { sock.write(early); setTimeout(() => sock.end(`HTTP/1.1 100 Continue\r\n\r\n${OK_200}`), 50); },
    answer: (sock) => sock.write(`${early}HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello`),
  });
  const bad = {
    upgrade: 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n',
    // 1xx heads adding up to more than the probe's 16 KiB, then a 200.
    flood: `HTTP/1.1 103 Early Hints\r\nLink: <${'x'.repeat(1000)}>\r\n\r\n`.repeat(20) + OK_200,
    six: 'HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok',
  };
  const bads = {};
  for (const [name, text] of Object.entries(bad)) {
    bads[name] = await rawModelServer({ health: (sock) => sock.end(text), answer: (sock) => sock.end(OK_200) });
  }
  const act = await startActivator({
    models: [
      { name: 'early', backend: be.url, holdTimeoutSeconds: 3, ...fast },
      ...Object.keys(bad).map((name) => ({ name, backend: bads[name].url, holdTimeoutSeconds: 1, ...fast })),
    ],
  });
  try {
    const r = await complete(act.port, 'early', { timeoutMs: 10000 });
    assert.equal(r.status, 200, r.body.toString());
    assert.equal(r.body.toString(), 'hello');
    assert.equal((await act.model('early')).state, 'ready');
    const held = await Promise.all(Object.keys(bad).map((name) => complete(act.port, name, { timeoutMs: 10000 })));
    for (const [i, name] of Object.keys(bad).entries()) {
      assert.equal(held[i].status, 504, `${name}: ${held[i].body}`);
      assert.ok(bads[name].healthConns >= 2, `${name}: ${bads[name].healthConns} probes`);
      assert.notEqual((await act.model(name)).state, 'ready', name);
    }
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_probes_total', { model: 'upgrade', result: 'ok' }), 0);
    const out = act.proc.output();
    assert.match(out, /event=probe_failed endpoint=\S+ result=101 reason="unexpected 101/);
    assert.match(out, /event=probe_failed endpoint=\S+ result=-71 reason="invalid response"/);
  } finally {
    await act.stop();
    await be.close();
    for (const s of Object.values(bads)) await s.close();
  }
});

test('a backend status outside 100..599 is a 502; a backend closing without an answer is logged as such, not err="Success"', async () => {
  const be = await rawModelServer({
    health: (sock) => sock.end(OK_200),
    answer: (sock, s) => {
      s.answered = (s.answered ?? 0) + 1;
      if (s.mode === 'close') sock.end(); // FIN, no answer: errno 0
      else sock.write('HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok');
    },
  });
  const act = await startActivator({ models: [{ name: 'odd', backend: be.url, ...fast }] });
  try {
    const r = await complete(act.port, 'odd');
    assert.equal(r.status, 502, r.body.toString());
    assert.equal(JSON.parse(r.body).error.code, 'bad_gateway');
    assert.match(r.body.toString(), /the model server sent an invalid response/);
    await act.proc.waitForLog(/event=upstream_bad_response .*err="malformed status line"/, 1000);
    be.mode = 'close';
    const c = await complete(act.port, 'odd');
    assert.equal(c.status, 502, c.body.toString());
    assert.match(c.body.toString(), /the model server closed the connection/);
    await act.proc.waitForLog(/event=upstream_error .*err="closed by the model server"/, 1000);
    assert.doesNotMatch(act.proc.output(), /err="Success"/);
  } finally {
    await act.stop();
    await be.close();
  }
});
