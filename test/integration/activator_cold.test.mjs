// thaw-activator cold path, against a real Redis and real fake vLLM servers:
// requests to a model at zero replicas are held, the wake signal and held
// counts reach Redis, readiness is probed, held requests are released as soon
// as the backend answers healthy, and every failure mode is an explicit answer.
// The test plays the scaler: it listens on thaw:wake and starts the backend.
import { after, before, test } from 'node:test';

import {
  assert, assertAccounted, complete, freePort, metricSum, request, sleep, startActivator,
  startFakeVllm, subscribe, waitUntil,
} from './activator_lib.mjs';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

import { underSanitizer } from './faults_lib.mjs';
import { startRedis, tmpDir } from './lib/harness.mjs';

let redis;
let wakes;

before(async () => {
  redis = await startRedis();
  wakes = await subscribe(redis.port, 'thaw:wake');
});

after(async () => {
  wakes?.close();
});

function modelCfg(name, port, extra = {}) {
  return { name, backend: `http://127.0.0.1:${port}`, probeInitialMs: 5, probeMaxMs: 20, ...extra };
}

function percentile(values, p) {
  const v = [...values].sort((a, b) => a - b);
  return v[Math.min(v.length - 1, Math.ceil((p / 100) * v.length) - 1)];
}

test('100 requests to a cold model all succeed; wake signal and held count reach Redis; release is fast', async () => {
  const port = await freePort();
  const act = await startActivator({ models: [modelCfg('cold1', port)] }, { redisUrl: redis.url });
  try {
    const since = wakes.messages.length;
    const t0 = Date.now();
    const pending = Array.from({ length: 100 }, (_, i) => complete(act.port, 'cold1', { prompt: `p${i}` }));
    // The scaler's view: one wake message, then the held count in the hash.
    const wake = await wakes.waitFor((m) => m.payload === 'cold1' && m.t >= t0, 5000);
    assert.ok(wake.t - t0 < 1000, `wake after ${wake.t - t0} ms`);
    const held = await waitUntil(async () => {
      const v = await redis.cli('HGET', 'thaw:held:cold1', 'act-test');
      return v && Number(v.split(':')[0]) === 100 ? v : null;
    }, 5000, { what: 'held count 100 in Redis' });
    // <held>:<unix-ms>, no :<queued> part: a cold model's requests are all held.
    assert.equal(held.split(':').length, 2, `two-part value ${held}`);
    const [, ms] = held.split(':');
    assert.ok(Math.abs(Number(ms) - Date.now()) < 5000, `fresh timestamp ${ms}`);
    // Refreshed every second while holding.
    await sleep(1200);
    const again = await redis.cli('HGET', 'thaw:held:cold1', 'act-test');
    assert.ok(Number(again.split(':')[1]) > Number(ms), `${again} after ${held}`);
    assert.equal((await act.model('cold1')).state, 'waking');

    // Scale up: the backend takes 800 ms to load.
    const fv = await startFakeVllm({ model: 'cold1', port, loadDelayMs: 800 });
    const readyAt = await fv.ready();
    const results = await Promise.all(pending);
    for (const r of results) {
      assert.equal(r.status, 200, r.body.toString());
      assert.ok(Number(r.headers['x-thaw-cold-start-ms']) > 0);
    }
    // First healthy answer as logged by the activator, then every response
    // head within 50 ms of it (p99).
    const healthy = await act.proc.waitForLog(/event=endpoint_healthy/);
    const healthyAt = Date.parse(/ts=(\S+)/.exec(healthy.input)[1]);
    assert.ok(healthyAt >= readyAt - 2, `healthy ${healthyAt} before ready ${readyAt}`);
    // The activator's part: every held request dispatched within 50 ms of
    // the first healthy answer (its own log timestamps).
    let releasedCount = 0;
    let lastRelease = 0;
    for (const l of act.proc.lines) {
      const rm = /event=released model=cold1 count=(\d+)/.exec(l.line);
      if (rm) {
        releasedCount += Number(rm[1]);
        lastRelease = Date.parse(/ts=(\S+)/.exec(l.line)[1]);
      }
    }
    assert.equal(releasedCount, 100);
    // Timing bounds hold on a plain build; under valgrind everything is ~30x slower.
    const timed = !process.env.THAW_TEST_WRAPPER;
    if (timed) {
      assert.ok(lastRelease - healthyAt < 50, `released ${lastRelease - healthyAt} ms after healthy`);
      assert.ok(healthyAt - readyAt < 60, `probe noticed readiness after ${healthyAt - readyAt} ms`);
    }
    // End to end: response heads after the healthy answer, against the
    // backend's own latency for 100 concurrent requests sent to it directly.
    const lat = results.map((r) => r.tHead - healthyAt);
    const direct = await Promise.all(Array.from({ length: 100 }, () => {
      const s = Date.now();
      return complete(port, 'cold1').then((r) => r.tHead - s);
    }));
    const p99 = percentile(lat, 99);
    const d99 = percentile(direct, 99);
    console.log(`release ms: min ${Math.min(...lat)} p50 ${percentile(lat, 50)} p99 ${p99}; ` +
      `backend alone p99 ${d99}`);
    // A sanity bound only: on a shared 2-core machine both figures swing by
    // tens of ms; the precise check of the 50 ms goal is the one above.
    if (timed) assert.ok(p99 - d99 < 100, `release p99 ${p99} ms vs backend alone ${d99} ms`);

    // Nothing held any more: the field is removed once the served requests'
    // in-flight peak has shown for two refreshes.
    await waitUntil(async () => (await redis.cli('HEXISTS', 'thaw:held:cold1', 'act-test')) === '0',
      5000, { what: 'HDEL of the held field' });
    assert.equal(wakes.messages.filter((m) => m.payload === 'cold1').length - 0, 1);
    assert.ok(wakes.messages.length > since);
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'cold1', outcome: 'ok' }), 100);
    assert.equal(metricSum(m, 'thaw_activator_cold_starts_total', { model: 'cold1' }), 1);
    assert.equal(metricSum(m, 'thaw_activator_wake_signals_total', { model: 'cold1' }), 1);
    assert.equal(metricSum(m, 'thaw_activator_hold_duration_seconds_count', { model: 'cold1' }), 100);
    await assertAccounted(act);
    await fv.stop();
  } finally {
    await act.stop();
  }
});

test('hold overflow: the excess gets 503 with Retry-After at once, the rest succeed', async () => {
  const port = await freePort();
  const act = await startActivator({
    limits: { retryAfterSeconds: 7 },
    models: [modelCfg('over', port, { maxHeldRequests: 10 })],
  }, { redisUrl: redis.url });
  try {
    const first = Array.from({ length: 10 }, () => complete(act.port, 'over'));
    await waitUntil(async () => (await act.model('over')).held === 10, 5000, { what: '10 held' });
    const t0 = Date.now();
    const extra = await Promise.all(Array.from({ length: 5 }, () => complete(act.port, 'over')));
    for (const r of extra) {
      assert.equal(r.status, 503);
      assert.equal(r.headers['retry-after'], '7');
      assert.equal(JSON.parse(r.body).error.code, 'hold_queue_full');
    }
    assert.ok(Date.now() - t0 < 1000);
    const fv = await startFakeVllm({ model: 'over', port });
    const ok = await Promise.all(first);
    for (const r of ok) assert.equal(r.status, 200);
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'over', outcome: 'hold_full' }), 5);
    await assertAccounted(act);
    await fv.stop();
  } finally {
    await act.stop();
  }
});

test('hold deadline: 504 once holdTimeoutSeconds pass without a ready backend', async () => {
  const port = await freePort();
  const act = await startActivator({
    models: [modelCfg('late', port, { holdTimeoutSeconds: 2 })],
  }, { redisUrl: redis.url });
  // A failure outcome's series is there at 0 from the model's first request,
  // before the first such failure: rate() misses a series that appears at 1.
  const series = (m) => m.has('thaw_activator_requests_total{model="late",outcome="hold_timeout"}');
  try {
    assert.equal(series(await act.metrics()), false, 'no failure series before any request');
    const t0 = Date.now();
    const pending = [complete(act.port, 'late'), complete(act.port, 'late')];
    await waitUntil(async () => (await act.model('late')).held === 2, 1500, { what: 'both held' });
    const before = await act.metrics();
    assert.ok(series(before) && metricSum(before, 'thaw_activator_requests_total',
      { model: 'late', outcome: 'hold_timeout' }) === 0, 'hold_timeout at 0 while the first requests are held');
    const rs = await Promise.all(pending);
    const dt = Date.now() - t0;
    for (const r of rs) {
      assert.equal(r.status, 504);
      assert.equal(JSON.parse(r.body).error.code, 'hold_timeout');
    }
    assert.ok(dt >= 1950 && dt < 3000, `504 after ${dt} ms`);
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'late', outcome: 'hold_timeout' }), 2);
    // Probing went on the whole time, with backoff.
    assert.ok(metricSum(m, 'thaw_activator_probes_total', { model: 'late', result: 'fail' }) >= 5);
    await assertAccounted(act);
    // Nothing held and the wake went unanswered: back to cold after the timeout.
    await waitUntil(async () => (await act.model('late')).state === 'cold', 3000, { what: 'cold again' });
  } finally {
    await act.stop();
  }
});

test('scale-down race: refused connections while ready are held and retried, never an error', async () => {
  const port = await freePort();
  const act = await startActivator({ models: [modelCfg('race', port)] }, { redisUrl: redis.url });
  try {
    let fv = await startFakeVllm({ model: 'race', port, waitReady: true });
    // Warm: ready, with pooled connections.
    for (let i = 0; i < 5; i++) assert.equal((await complete(act.port, 'race')).status, 200);
    assert.equal((await act.model('race')).state, 'ready');
    const before = wakes.messages.filter((m) => m.payload === 'race').length;
    // Scaled down under the activator's feet.
    await fv.proc.kill();
    const t0 = Date.now();
    const pending = Array.from({ length: 10 }, () => complete(act.port, 'race'));
    await waitUntil(async () => (await act.model('race')).state === 'waking', 3000, { what: 'waking' });
    await wakes.waitFor((m) => m.payload === 'race' && m.t >= t0, 3000);
    await sleep(300);
    fv = await startFakeVllm({ model: 'race', port, loadDelayMs: 200 });
    const rs = await Promise.all(pending);
    for (const r of rs) assert.equal(r.status, 200, r.body.toString());
    assert.ok(rs.every((r) => r.headers['x-thaw-cold-start-ms'] !== undefined));
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_model_transitions_total', { model: 'race', from: 'ready', to: 'waking' }), 1);
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'race', outcome: 'bad_gateway' }), 0);
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'race', outcome: 'ok' }), 15);
    assert.equal(wakes.messages.filter((x) => x.payload === 'race').length, before + 1);
    await assertAccounted(act);
    await fv.stop();
  } finally {
    await act.stop();
  }
});

test('Redis down: requests are still held and probed; the link reconnects later', async () => {
  const r2 = await startRedis();
  const port = await freePort();
  const act = await startActivator({ models: [modelCfg('nored', port)] },
    { redisUrl: r2.url, args: ['--redis-timeout-ms', '300'] });
  try {
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 1, 5000,
      { what: 'redis up' });
    await r2.stop();
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 0, 5000,
      { what: 'redis down seen' });
    const pending = complete(act.port, 'nored');
    await waitUntil(async () => (await act.model('nored')).held === 1, 3000, { what: 'held' });
    const fv = await startFakeVllm({ model: 'nored', port, loadDelayMs: 100 });
    const r = await pending;
    assert.equal(r.status, 200);
    await fv.stop();
    // Redis back on the same port: the link comes back by itself and the
    // next cold start is signalled.
    await r2.restart();
    const sub = await subscribe(r2.port, 'thaw:wake');
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 1, 10000,
      { what: 'redis reconnected' });
    // Ready with a dead backend: the next request finds out and re-wakes.
    const again = complete(act.port, 'nored');
    await sub.waitFor((m) => m.payload === 'nored', 5000);
    const fv2 = await startFakeVllm({ model: 'nored', port });
    assert.equal((await again).status, 200);
    sub.close();
    await fv2.stop();
    await assertAccounted(act);
  } finally {
    await act.stop();
    await r2.stop();
  }
});

test('admin wake ahead of traffic, with wakeWith; unknown model 404', async () => {
  const [p2, p3] = [await freePort(), await freePort()];
  const act = await startActivator({
    models: [modelCfg('w2', p2, { wakeWith: ['w3'] }), modelCfg('w3', p3)],
  }, { redisUrl: redis.url });
  try {
    const t0 = Date.now();
    const r = await request(act.adminPort, { path: '/models/w2/wake', method: 'POST' });
    assert.equal(r.status, 202);
    await wakes.waitFor((m) => m.payload === 'w2' && m.t >= t0, 3000);
    await wakes.waitFor((m) => m.payload === 'w3' && m.t >= t0, 3000);
    assert.equal((await act.model('w2')).state, 'waking');
    assert.equal((await act.model('w3')).state, 'waking');
    const fv = await startFakeVllm({ model: 'w3', port: p3 });
    await waitUntil(async () => (await act.model('w3')).state === 'ready', 3000, { what: 'w3 ready' });
    // Already ready: the first request goes straight through, no hold.
    const x = await complete(act.port, 'w3');
    assert.equal(x.status, 200);
    assert.equal(x.headers['x-thaw-cold-start-ms'], undefined);
    const nf = await request(act.adminPort, { path: '/models/nope/wake', method: 'POST' });
    assert.equal(nf.status, 404);
    const get = await request(act.adminPort, { path: '/models/w2/wake' });
    assert.equal(get.status, 405);
    await fv.stop();
  } finally {
    await act.stop();
  }
});

test('the longest model name, with a slash and a quote: routed by body, woken by admin path (as is or %2F), counted, published; %00 does not wake a prefix', async () => {
  const port = await freePort();
  const name = `org/${'n'.repeat(500)}"q${'z'.repeat(6)}`;
  assert.equal(Buffer.byteLength(name), 512);
  const act = await startActivator({ models: [modelCfg(name, port, { holdTimeoutSeconds: 1 }), modelCfg('org', port)] },
    { redisUrl: redis.url });
  try {
    const t0 = Date.now();
    const enc = encodeURIComponent(name);
    for (const path of [`/models/${name.replace('"', '%22')}/wake`, `/models/${enc}/wake`]) {
      const r = await request(act.adminPort, { path, method: 'POST' });
      assert.equal(r.status, 202, `${path.slice(0, 40)}...: ${r.status} ${r.body}`);
    }
    await wakes.waitFor((m) => m.payload === name && m.t >= t0, 3000);
    // "org%00x" must not wake "org".
    const nul = await request(act.adminPort, { path: '/models/org%00x/wake', method: 'POST' });
    assert.equal(nul.status, 404);
    assert.equal((await act.model('org')).state, 'cold');
    // Routed by its body (the name was cut at 256 bytes before), held, then
    // answered at its hold deadline.
    const held = complete(act.port, name);
    await waitUntil(async () => (await redis.cli('HGET', `thaw:held:${name}`, 'act-test')) !== null, 3000,
      { what: 'its thaw:held field' });
    const r = await held;
    assert.equal(r.status, 504, r.body.toString());
    const m = await act.metrics();
    // (the exposition escapes the quote)
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: name.replace('"', '\\"'), outcome: 'hold_timeout' }), 1);
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

test('tiers: high-priority requests shed low ones when full and are released first', async () => {
  const port = await freePort();
  const act = await startActivator({
    apiKeyTiers: { 'sk-gold': 'high' },
    models: [modelCfg('tier', port, { maxHeldRequests: 3, maxConcurrencyPerEndpoint: 1 })],
  }, { redisUrl: redis.url });
  try {
    const done = [];
    const track = (label, p) => p.then((r) => { done.push({ label, status: r.status, r }); return r; });
    const lows = [0, 1, 2].map((i) => track(`low${i}`, complete(act.port, 'tier', { headers: { 'x-thaw-priority': 'low' } })));
    await waitUntil(async () => (await act.model('tier')).held === 3, 3000, { what: '3 held' });
    const highs = [0, 1].map((i) => track(`high${i}`, complete(act.port, 'tier', {
      headers: i === 0 ? { 'x-thaw-priority': 'high' } : { authorization: 'Bearer sk-gold' } })));
    await waitUntil(() => done.length === 2, 3000, { what: 'two lows shed' });
    for (const d of done) {
      assert.match(d.label, /^low/);
      assert.equal(d.status, 503);
      assert.equal(JSON.parse(d.r.body).error.code, 'shed');
    }
    // The newest lows were shed; the oldest low waits behind both highs.
    assert.deepEqual(done.map((d) => d.label).sort(), ['low1', 'low2']);
    const fv = await startFakeVllm({ model: 'tier', port });
    await Promise.all([...lows, ...highs]);
    const served = done.filter((d) => d.status === 200).map((d) => d.label);
    assert.deepEqual(served, ['high0', 'high1', 'low0']);
    await fv.stop();
  } finally {
    await act.stop();
  }
});

test('SSE heartbeat for long holds: comment lines first, then the token stream', async () => {
  const port = await freePort();
  const act = await startActivator({
    models: [modelCfg('hb', port, { sseHeartbeatSeconds: 0.2 })],
  }, { redisUrl: redis.url });
  try {
    const pending = request(act.port, {
      path: '/v1/chat/completions',
      body: { model: 'hb', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'x' }] },
    });
    const plain = complete(act.port, 'hb'); // not streaming: no heartbeat
    // Nor to a HEAD, whose answer has no body to carry the comments.
    const head = request(act.port, {
      method: 'HEAD', path: '/v1/chat/completions', timeoutMs: 10000,
      body: { model: 'hb', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'x' }] },
    });
    await sleep(700);
    const fv = await startFakeVllm({ model: 'hb', port });
    const r = await pending;
    assert.equal(r.status, 200);
    assert.equal(r.headers['x-thaw-heartbeat'], '1');
    const text = r.body.toString();
    const beats = text.split('\n').filter((l) => l.startsWith(': thaw'));
    assert.ok(beats.length >= 2, text);
    assert.ok(text.indexOf(': thaw') < text.indexOf('data: '));
    assert.ok(text.trimEnd().endsWith('data: [DONE]'), text);
    const p = await plain;
    assert.equal(p.status, 200);
    assert.equal(p.headers['x-thaw-heartbeat'], undefined);
    const h = await head;
    assert.equal(h.headers['x-thaw-heartbeat'], undefined, JSON.stringify(h.headers));
    assert.equal(h.body.length, 0);
    await fv.stop();
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

test('fallbackBackend: requests held fallbackAfterSeconds go to the fallback while the model wakes, still counted as held', async () => {
  const mainPort = await freePort();
  // A slower stand-in serving the same model name (a smaller or quantized build).
  const fb = await startFakeVllm({ model: 'fbm', tokensPerSecond: 10, waitReady: true });
  const act = await startActivator({
    models: [modelCfg('fbm', mainPort, { fallbackBackend: fb.url, fallbackAfterSeconds: 1 })],
  }, { redisUrl: redis.url });
  let main = null;
  try {
    const t0 = Date.now();
    const first = Array.from({ length: 3 }, (_, i) => complete(act.port, 'fbm', { prompt: `f${i}`, maxTokens: 60 }));
    // Held for a second, then on the fallback (60 tokens at 10/s: about 6 s
    // there), published to the scaler as held all along.
    await waitUntil(async () => (await act.model('fbm')).fallbackRequests === 3, 3000, { what: 'sent to the fallback' });
    const sentAt = Date.now() - t0;
    assert.ok(sentAt >= 950, `sent to the fallback after ${sentAt} ms (fallbackAfterSeconds 1)`);
    assert.equal((await act.model('fbm')).held, 0);
    await sleep(1200); // past a refresh of the Redis field
    const v = await redis.cli('HGET', 'thaw:held:fbm', 'act-test');
    assert.equal(v.split(':')[0], '3', `the fallback's requests still count as held: ${v}`);
    for (const r of await Promise.all(first)) {
      assert.equal(r.status, 200, r.body.toString());
      assert.equal(r.headers['x-thaw-fallback'], 'true');
      const cold = Number(r.headers['x-thaw-cold-start-ms']);
      assert.ok(cold >= 950 && cold < 2500, `held ${cold} ms before the fallback`);
    }
    assert.equal((await act.model('fbm')).state, 'waking', 'the model itself is still waking');

    // The model comes up: a request waiting less than fallbackAfterSeconds
    // goes to it, not to the fallback (30 s now, so the start-up of the
    // model's server cannot race it).
    act.writeConfig({ models: [modelCfg('fbm', mainPort, { fallbackBackend: fb.url, fallbackAfterSeconds: 30 })] });
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded/, 3000);
    const second = complete(act.port, 'fbm', { prompt: 'main' });
    await sleep(300);
    main = await startFakeVllm({ model: 'fbm', port: mainPort });
    const r2 = await second;
    assert.equal(r2.status, 200);
    assert.equal(r2.headers['x-thaw-fallback'], undefined);
    const r3 = await complete(act.port, 'fbm');
    assert.equal(r3.headers['x-thaw-fallback'], undefined);
    assert.equal(r3.headers['x-thaw-cold-start-ms'], undefined);
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_fallback_requests_total', { model: 'fbm' }), 3);
    await waitUntil(async () => (await redis.cli('HEXISTS', 'thaw:held:fbm', 'act-test')) === '0', 5000,
      { what: 'the held field removed (two refreshes after the last request in a backend)' });
    await assertAccounted(act);
  } finally {
    await act.stop();
    await main?.stop();
    await fb.stop();
  }
});

test('fallbackBackend down: it takes nothing; held requests wait for the model and are served by it', async () => {
  const mainPort = await freePort();
  const deadPort = await freePort();
  const act = await startActivator({
    models: [modelCfg('fbd', mainPort, { fallbackBackend: `http://127.0.0.1:${deadPort}`, fallbackAfterSeconds: 0.2 })],
  }, { redisUrl: redis.url });
  let main = null;
  try {
    const pending = Array.from({ length: 2 }, () => complete(act.port, 'fbd'));
    await sleep(1000);
    const model = await act.model('fbd');
    assert.equal(model.held, 2, 'still held: the fallback is not healthy');
    assert.equal(model.fallbackRequests, 0);
    main = await startFakeVllm({ model: 'fbd', port: mainPort });
    for (const r of await Promise.all(pending)) {
      assert.equal(r.status, 200);
      assert.equal(r.headers['x-thaw-fallback'], undefined);
    }
    await assertAccounted(act);
  } finally {
    await act.stop();
    await main?.stop();
  }
});

test('fallbackBackend: requests queued at the cap go to the fallback when the model\'s endpoints all go', async () => {
  const main = await startFakeVllm({ model: 'fbq', tokensPerSecond: 10, waitReady: true });
  const fb = await startFakeVllm({ model: 'fbq', waitReady: true });
  const eps = path.join(tmpDir('thaw-fbq-'), 'eps');
  fs.writeFileSync(eps, `127.0.0.1:${main.port}\n`);
  const act = await startActivator({
    models: [{ name: 'fbq', endpointsFile: eps, probeInitialMs: 5, probeMaxMs: 20, maxConcurrencyPerEndpoint: 1,
      fallbackBackend: fb.url, fallbackAfterSeconds: 0.3, holdTimeoutSeconds: 20 }],
  }, { redisUrl: redis.url });
  try {
    assert.equal((await complete(act.port, 'fbq')).status, 200); // ready
    const a = complete(act.port, 'fbq', { maxTokens: 30 }); // 3 s on the only slot
    await waitUntil(async () => (await act.model('fbq')).inflight === 1, 3000, { what: 'a in flight' });
    const b = complete(act.port, 'fbq', { prompt: 'queued' });
    await waitUntil(async () => (await act.model('fbq')).held === 1, 3000, { what: 'b queued at the cap' });
    fs.writeFileSync(eps, '# scaled to zero\n'); // the replica leaves the list
    const rb = await b;
    assert.equal(rb.status, 200, rb.body.toString());
    assert.equal(rb.headers['x-thaw-fallback'], 'true');
    assert.equal((await a).status, 200, 'the request on the leaving replica finishes');
    assert.equal((await act.model('fbq')).fallbackRequests, 1);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await main.stop();
    await fb.stop();
  }
});

test('fallbackBackend: the model keeps waking while the fallback serves everything (past holdTimeoutSeconds)', async () => {
  const deadPort = await freePort();
  const fb = await startFakeVllm({ model: 'fbw', tokensPerSecond: 10, waitReady: true });
  const act = await startActivator({
    models: [modelCfg('fbw', deadPort, { fallbackBackend: fb.url, fallbackAfterSeconds: 0.2, holdTimeoutSeconds: 1.5 })],
  }, { redisUrl: redis.url });
  try {
    const r = complete(act.port, 'fbw', { maxTokens: 40, timeoutMs: 20000 }); // about 4 s on the fallback
    await waitUntil(async () => (await act.model('fbw')).fallbackRequests === 1, 3000, { what: 'on the fallback' });
    await sleep(2500); // past holdTimeoutSeconds with nothing in the hold queue
    assert.equal((await act.model('fbw')).state, 'waking', 'still waking (and probing) for the request on the fallback');
    assert.equal((await r).status, 200);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fb.stop();
  }
});

test('fallbackBackend that stops answering: requests go back to the hold queue, the model serves them, each counted once', async () => {
  const mainPort = await freePort();
  const fb = await startFakeVllm({ model: 'fbs', waitReady: true });
  const act = await startActivator({
    models: [modelCfg('fbs', mainPort, { fallbackBackend: fb.url, fallbackAfterSeconds: 0.2 })],
  }, { redisUrl: redis.url });
  let main = null;
  try {
    const r1 = await complete(act.port, 'fbs');
    assert.equal(r1.headers['x-thaw-fallback'], 'true');
    await fb.stop();
    const r2 = complete(act.port, 'fbs', { timeoutMs: 20000 });
    await waitUntil(async () => (await act.model('fbs')).fallbackRequests === 2, 3000, { what: 'sent to the dead fallback' });
    await sleep(500);
    assert.equal((await act.model('fbs')).held, 1, 'back in the hold queue');
    main = await startFakeVllm({ model: 'fbs', port: mainPort });
    const res = await r2;
    assert.equal(res.status, 200);
    assert.equal(res.headers['x-thaw-fallback'], undefined, 'served by the model');
    assert.equal((await act.model('fbs')).fallbackRequests, 2, 'each request counted once');
    await assertAccounted(act);
  } finally {
    await act.stop();
    await main?.stop();
  }
});

test('fallbackBackend removed by a reload and added back: nothing goes to it while removed; re-added (same or new address), held requests go to it again', async () => {
  const mainPort = await freePort();
  const fb = await startFakeVllm({ model: 'fbr', waitReady: true });
  const withFallback = (url) => ({ models: [modelCfg('fbr', mainPort, { fallbackBackend: url, fallbackAfterSeconds: 0.2 })] });
  // fallbackAfterSeconds stays: only the backend goes.
  const without = { models: [modelCfg('fbr', mainPort, { fallbackAfterSeconds: 0.2 })] };
  const act = await startActivator(withFallback(fb.url), { redisUrl: redis.url });
  let fb2 = null;
  const reload = async (cfg) => {
    const since = act.proc.mark();
    act.writeConfig(cfg);
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded/, 3000, { since });
  };
  try {
    const r1 = await complete(act.port, 'fbr');
    assert.equal(r1.headers['x-thaw-fallback'], 'true', 'the fallback serves while the model is down');

    await reload(without);
    const r2 = complete(act.port, 'fbr', { prompt: 'while removed', timeoutMs: 20000 });
    await sleep(1000); // five times fallbackAfterSeconds
    let model = await act.model('fbr');
    assert.equal(model.held, 1, 'held: the removed fallback takes nothing');
    assert.equal(model.fallbackRequests, 1);

    // Added back at the same address: the held request goes there.
    await reload(withFallback(fb.url));
    const res2 = await r2;
    assert.equal(res2.status, 200, res2.body.toString());
    assert.equal(res2.headers['x-thaw-fallback'], 'true');
    assert.equal((await act.model('fbr')).fallbackRequests, 2);

    // Removed again, its server replaced by one at a new address; added back
    // there. The old one is stopped, so only the new one can answer.
    await reload(without);
    await fb.stop();
    fb2 = await startFakeVllm({ model: 'fbr', waitReady: true });
    const r3 = complete(act.port, 'fbr', { prompt: 'new address', timeoutMs: 20000 });
    await sleep(500);
    assert.equal((await act.model('fbr')).held, 1);
    await reload(withFallback(fb2.url));
    const res3 = await r3;
    assert.equal(res3.status, 200, res3.body.toString());
    assert.equal(res3.headers['x-thaw-fallback'], 'true');
    model = await act.model('fbr');
    assert.equal(model.fallbackRequests, 3);
    assert.equal(model.state, 'waking', 'the model itself is still waking');
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fb.stop();
    await fb2?.stop();
  }
});

test('a model removed by a reload while requests are held: Redis sees them, then their end; its outcomes stay counted; configs do not pile up', async (t) => {
  const keepPort = await freePort();
  const keep = await startFakeVllm({ model: 'rk', port: keepPort, waitReady: true });
  const deadPort = await freePort();
  const withGone = { models: [modelCfg('rk', keepPort), modelCfg('rgone', deadPort, { holdTimeoutSeconds: 8 })] };
  const act = await startActivator(withGone, { redisUrl: redis.url });
  const reload = async (cfg, re = /event=config_reloaded/) => {
    const since = act.proc.mark();
    act.writeConfig(cfg);
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(re, 3000, { since });
  };
  const field = async () => redis.cli('HGET', 'thaw:held:rgone', 'act-test');
  try {
    assert.equal((await complete(act.port, 'rk')).status, 200);
    // Caught: a failing assertion below stops the activator under it.
    const held = complete(act.port, 'rgone', { timeoutMs: 20000 }).catch((e) => ({ status: `error ${e.message}` }));
    await waitUntil(async () => (await field())?.startsWith('1:'), 3000, { what: 'held 1 in Redis' });
    await reload({ models: [modelCfg('rk', keepPort)] });
    // Still held (it waits for its backend, as before the reload) and still
    // published: the scaler must go on seeing it.
    const first = await field();
    await sleep(1300);
    const again = await field();
    assert.ok(again?.startsWith('1:') && Number(again.split(':')[1]) > Number(first.split(':')[1]),
      `refreshed: ${first} then ${again}`);
    // Reloads meanwhile keep no configs but the one the removed model uses.
    const rss = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${act.proc.proc.pid}/status`, 'utf8'))[1]);
    const big = { models: [modelCfg('rk', keepPort), ...Array.from({ length: 50 }, (_, i) => modelCfg(`rx${i}`, deadPort))] };
    fs.writeFileSync(act.configPath, JSON.stringify(big));
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded models=51/, 3000);
    const rss0 = rss();
    const mark = act.proc.mark();
    for (let i = 0; i < 150; i++) {
      act.proc.proc.kill('SIGHUP');
      await sleep(10);
    }
    await sleep(300);
    const grown = rss() - rss0;
    const reloads = act.proc.output().split('\n').slice(mark).filter((l) => /config_reloaded/.test(l)).length;
    assert.ok(reloads >= 100, `${reloads} reloads`);
    t.diagnostic(`RSS grew ${grown} KB over ${reloads} reloads of 51 models`);
    assert.ok((await field())?.startsWith('1:'), 'still held after the reloads');
    // Kept, each config of 51 models cost about 26 KB (3.9 MB for 150). A
    // sanitizer's quarantine keeps freed memory: only the count is checked.
    if (!underSanitizer) assert.ok(grown < 2000, `RSS grew ${grown} KB over ${reloads} reloads`);
    // The hold times out: 504, and the field goes at once, not left to go stale.
    assert.equal((await held).status, 504);
    await waitUntil(async () => (await field()) === null || (await field()) === '', 2000,
      { what: 'thaw:held:rgone field deleted' });
    await act.proc.waitForLog(/event=model_removed model=rgone/, 2000);
    // Its outcomes outlive it, and a model of that name goes on from them.
    let m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'rgone', outcome: 'hold_timeout' }), 1);
    await assertAccounted(act);
    await reload(withGone);
    m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'rgone', outcome: 'hold_timeout' }), 1);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await keep.stop();
  }
});


// maxHeldBytes is meant to bound the memory held requests cost. Routing
// reads routeBodyBytes of a body; before, the connection read on up to
// bufferBytes (256 KiB) more of a long prompt while the request was held,
// uncharged: 200 prompts of 1 MiB were charged 13.9 MB and took 65 MB. A
// held client is no longer read further, and what it had sent is charged.
test('long prompts held: maxHeldBytes charges what they take (the rest of each body is not read meanwhile)', async (t) => {
  const deadPort = await freePort();
  const act = await startActivator({ models: [modelCfg('longp', deadPort, { holdTimeoutSeconds: 60 })],
    limits: { drainTimeoutSeconds: 0.5 } });
  const socks = [];
  try {
    const rss = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${act.proc.proc.pid}/status`, 'utf8'))[1]);
    // Bytes the process has read (sockets included), in KiB.
    const readKiB = () => Number(/rchar:\s+(\d+)/.exec(fs.readFileSync(`/proc/${act.proc.proc.pid}/io`, 'utf8'))[1]) / 1024;
    const rss0 = rss();
    const read0 = readKiB();
    const body = Buffer.from(`{"model":"longp","prompt":"${'x'.repeat(1024 * 1024)}"}`);
    for (let i = 0; i < 150; i++) {
      const s = net.connect(act.port, '127.0.0.1');
      s.on('error', () => {});
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
      s.write(body);
      socks.push(s);
    }
    await waitUntil(async () => (await act.model('longp')).held === 150, 10000, { what: '150 held' });
    await sleep(500);
    const m = await act.metrics();
    const charged = metricSum(m, 'thaw_activator_held_bytes', { model: 'longp' }) / 1024;
    const grown = rss() - rss0;
    const read = readKiB() - read0;
    t.diagnostic(`150 held 1 MiB prompts: charged ${charged.toFixed(0)} KiB, read ${read.toFixed(0)} KiB, RSS grew ${grown} KiB`);
    // Each is charged its head, routed body and what it had sent on top, and
    // no more is read from it while it is held (before, bufferBytes each).
    assert.ok(charged >= 150 * 64, `charged ${charged} KiB`);
    assert.ok(read < charged * 1.3 + 1024, `read ${read} KiB from clients for ${charged} KiB charged`);
    // A sanitizer's shadow memory and quarantine: only the charge is checked.
    if (!underSanitizer) assert.ok(grown < charged * 1.5 + 8192, `RSS grew ${grown} KiB for ${charged} KiB charged`);
  } finally {
    // A client gone with its upload unsent is seen only when its request is
    // answered (its FIN waits behind the data): the drain answers them.
    for (const s of socks) s.destroy();
    await act.stop();
  }
});

test('a crashed activator\'s thaw:held field is swept by a live writer of the key; live and unreadable fields stay; the key expires', async () => {
  const port = await freePort();
  const key = 'thaw:held:sweep1';
  const now = Date.now();
  // What a crashed activator left 11 minutes ago (the scaler ignores it
  // already), another activator's fresh field, one stamped 11 minutes ahead
  // (a clock that runs ahead: left alone), and a value another version might
  // write.
  await redis.cli('HSET', key, 'act-crashed', `7:${now - 11 * 60000}`, 'act-other', `2:${now}`,
    'act-ahead', `1:${now + 11 * 60000}`, 'act-odd', 'not-a-count');
  assert.equal(await redis.cli('PTTL', key), '-1');
  const act = await startActivator({ models: [modelCfg('sweep1', port)] }, { redisUrl: redis.url });
  try {
    const pending = complete(act.port, 'sweep1').catch((e) => e);
    // The activator's first write of the key sweeps it.
    await waitUntil(async () => (await redis.cli('HEXISTS', key, 'act-crashed')) === '0', 5000,
      { what: 'the crashed activator\'s field deleted' });
    assert.ok(await redis.cli('HGET', key, 'act-test'), 'our own field written');
    assert.equal(await redis.cli('HGET', key, 'act-other'), `2:${now}`);
    assert.equal(await redis.cli('HGET', key, 'act-ahead'), `1:${now + 11 * 60000}`);
    assert.equal(await redis.cli('HGET', key, 'act-odd'), 'not-a-count');
    const ttl = Number(await redis.cli('PTTL', key));
    assert.ok(ttl > 590000 && ttl <= 600000, `the key expires 10 minutes on: PTTL ${ttl}`);
    // Once a minute, not at every refresh: a field stale again is still there
    // a few refreshes later.
    await redis.cli('HSET', key, 'act-crashed2', `3:${now - 11 * 60000}`);
    await sleep(2500);
    assert.equal(await redis.cli('HGET', key, 'act-crashed2'), `3:${now - 11 * 60000}`);
    const fv = await startFakeVllm({ model: 'sweep1', port });
    try {
      assert.equal((await pending).status, 200);
    } finally {
      await fv.stop();
    }
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});
