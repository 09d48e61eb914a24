// Fault injection on the control path, with every real peer running: Redis,
// Prometheus, thaw-scaler, thaw-activator and thaw-fake-vllm backends, and a
// StreamIsActive consumer with KEDA's own retry loop (faults_lib.mjs).
//
//   1. Redis is killed (SIGKILL) and restarted empty on the same port while
//      the activator holds requests for a cold model. Expected: holding and
//      probing go on, new requests are still held, the held count reappears
//      in Redis after the restart, the scaler reconnects (held count seen,
//      the wake channel subscribed again: a new wake reaches its stream), and
//      once the backend comes up every request is answered 200.
//   2. thaw-scaler gets SIGTERM and is started again on the same port under
//      an open StreamIsActive stream. Expected: the stream ends cleanly
//      (status OK), the client retries on KEDA's schedule (2 s, then 4 s),
//      reaches the new process, and a wake from a held request is pushed on
//      the new stream.
//   3. thaw-scaler out of file descriptors: it should
//      neither spin nor flood its log, and serve again once some are free.
// Each case ends with accepted = answered on the activator's /metrics.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { after, before, test } from 'node:test';

import {
  complete, metricSum, request, startActivator, startFakeVllm, waitUntil,
} from './activator_lib.mjs';
import { accountedFor, assert, kedaPushClient, outcomeCounts, sleep, sseData } from './faults_lib.mjs';
import { freePort, startPrometheus, startRedis } from './lib/harness.mjs';
import { getDesired, sampleValue, scaledObjectRef, startScaler } from './lib/scaler_env.mjs';

let redis;
let prom;
let scaler;
let grpcPort;
let act;
const backendPort = {};
const MODELS = ['fp-a', 'fp-b', 'fp-c'];

function modelCfg(name) {
  return { name, backend: `http://127.0.0.1:${backendPort[name]}`, probeInitialMs: 20, probeMaxMs: 200,
    holdTimeoutSeconds: 120 };
}

function launchScaler() {
  return startScaler({
    prometheusUrl: prom.url,
    redisUrl: redis.url,
    name: 'thaw-scaler',
    // A fixed gRPC port: the restart case comes back on the same address.
    flags: { listen: `127.0.0.1:${grpcPort}`, 'staleness-limit-seconds': 30, 'source-timeout-ms': 500 },
  });
}

before(async () => {
  [redis, prom] = await Promise.all([startRedis(), startPrometheus({ scrapeTargets: [] })]);
  grpcPort = await freePort();
  for (const m of MODELS) backendPort[m] = await freePort();
  scaler = await launchScaler();
  act = await startActivator({ models: MODELS.map(modelCfg) },
    { redisUrl: redis.url, instanceId: 'act-faults', args: ['--redis-timeout-ms', '500'] });
});

after(async () => {
  if (act) await act.stop();
  if (scaler && scaler.proc.exitCode === null) {
    const code = await scaler.stop();
    assert.equal(code, 0, `thaw-scaler exit code; output:\n${scaler.proc.output().slice(-3000)}`);
  }
});

const held = async (model) => (await act.model(model)).held;
const heldInRedis = async (model) => {
  const v = await redis.cli('HGET', `thaw:held:${model}`, 'act-faults');
  return v ? Number(v.split(':')[0]) : null;
};
const numSub = async () => Number((await redis.cli('PUBSUB', 'NUMSUB', 'thaw:wake')).split('\n')[1]);

/** A cold model's request, streaming or not; resolves to a summary. */
function coldRequest(model, i) {
  if (i % 2 === 0) return complete(act.port, model, { prompt: `p${i}`, timeoutMs: 60000 });
  return request(act.port, {
    path: '/v1/chat/completions', timeoutMs: 60000,
    body: { model, stream: true, max_tokens: 3, messages: [{ role: 'user', content: `m${i}` }] },
  });
}

function assertServed(results, what) {
  for (const r of results) {
    assert.equal(r.status, 200, `${what}: ${r.body.toString().slice(0, 300)}`);
    assert.ok(Number(r.headers['x-thaw-cold-start-ms']) > 0, `${what}: held requests carry X-Thaw-Cold-Start-Ms`);
    if (/event-stream/.test(r.headers['content-type'] ?? '')) {
      assert.equal(sseData(r.body.toString()).at(-1), '[DONE]', `${what}: complete stream`);
    } else {
      assert.equal(JSON.parse(r.body).choices.length, 1, what);
    }
  }
}

test('Redis killed and restarted while requests are held: holding, probing and both reconnections', async (t) => {
  const refA = scaledObjectRef('fp-so-a', { model: 'fp-a' });
  const refB = scaledObjectRef('fp-so-b', { model: 'fp-b' });
  await scaler.client.getMetricSpec(refA);
  const kA = kedaPushClient(scaler.address, refA);
  const kB = kedaPushClient(scaler.address, refB);
  try {
    await waitUntil(async () => sampleValue(await scaler.metrics(), 'thaw_scaler_active_streams') === 2,
      5000, { what: 'two StreamIsActive streams open' });
    await waitUntil(async () => (await numSub()) >= 1, 5000, { what: 'the scaler subscribed to thaw:wake' });

    // 20 requests held; the wake reaches the stream, the count reaches Redis.
    const first = Array.from({ length: 20 }, (_, i) => coldRequest('fp-a', i));
    await kA.waitPush((p) => p.result === true, 3000);
    await waitUntil(async () => (await heldInRedis('fp-a')) === 20, 5000, { what: 'held 20 in Redis' });

    // Redis dies.
    const markS = scaler.proc.mark();
    const markA = act.proc.mark();
    await redis.kill();
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 0, 5000,
      { what: 'the activator sees Redis down' });
    await scaler.proc.waitForLog(/event=redis_connection up=false/, 5000, { since: markS });

    // Holding and probing go on without it; new requests are held too.
    const probes = async () => metricSum(await act.metrics(), 'thaw_activator_probes_total', { model: 'fp-a' });
    const p0 = await probes();
    const second = Array.from({ length: 10 }, (_, i) => coldRequest('fp-a', 100 + i));
    await waitUntil(async () => (await held('fp-a')) === 30, 5000, { what: '30 held with Redis down' });
    await sleep(1500);
    assert.equal((await act.model('fp-a')).state, 'waking');
    assert.equal(await held('fp-a'), 30, 'nothing answered or dropped while Redis is down');
    const p1 = await probes();
    assert.ok(p1 - p0 >= 3, `probing continued: ${p1 - p0} probes in 1.5 s`);
    assert.deepEqual(await outcomeCounts(act, 'fp-a'), {}, 'no request of fp-a ended yet');

    // Redis back on the same port, empty.
    const tUp = Date.now();
    await redis.restart();
    await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 1, 10000,
      { what: 'the activator reconnected' });
    await waitUntil(async () => (await heldInRedis('fp-a')) === 30, 5000, { what: 'held 30 back in Redis' });
    const heldBackMs = Date.now() - tUp;
    await act.proc.waitForLog(/event=redis_up/, 1000, { since: markA });
    // The scaler: both connections back, the held count counted.
    await scaler.proc.waitForLog(/event=redis_connection up=true/, 10000, { since: markS });
    await waitUntil(async () => (await numSub()) >= 1, 10000, { what: 'the scaler subscribed to thaw:wake again' });
    await waitUntil(async () => (await scaler.model('fp-so-a'))?.inputs.heldRequests === 30, 5000,
      { what: 'the scaler reads held 30' });
    assert.deepEqual(await scaler.client.isActive(refA), { result: true });
    assert.ok((await getDesired(scaler.client, refA)).value >= 1);
    assert.equal((await scaler.model('fp-so-a')).reason, 'held_requests');
    t.diagnostic(`held count back in Redis ${heldBackMs} ms after the restart`);

    // A wake after the restart travels activator -> Redis -> new subscription -> stream.
    const sinceB = kB.pushes.length;
    const tWake = Date.now();
    const bReq = coldRequest('fp-b', 0);
    await kB.waitPush((p) => p.result === true, 3000, { since: sinceB });
    t.diagnostic(`wake after the restart pushed in ${Date.now() - tWake} ms`);
    assert.equal(kA.attempts.length, 1, 'the stream survived the Redis outage');
    assert.equal(kB.attempts.length, 1, 'the stream survived the Redis outage');

    // The backends come up: every request is answered.
    const fa = await startFakeVllm({ model: 'fp-a', port: backendPort['fp-a'], loadDelayMs: 300 });
    const fb = await startFakeVllm({ model: 'fp-b', port: backendPort['fp-b'] });
    assertServed(await Promise.all([...first, ...second]), 'fp-a');
    assertServed([await bReq], 'fp-b');
    await waitUntil(async () => (await redis.cli('HEXISTS', 'thaw:held:fp-a', 'act-faults')) === '0', 5000,
      { what: 'the held field removed once nothing is held or was in a backend for two refreshes' });
    const acc = await accountedFor(act);
    assert.deepEqual(acc.outcomes, { ok: 31 }, 'every request answered 200');
    const m = await act.metrics();
    assert.equal(metricSum(m, 'thaw_activator_cold_starts_total', { model: 'fp-a' }), 1);
    // All of it came from a real Redis (HSET, HDEL, PUBLISH, held-count
    // scripts, wakes, a kill and a restart): the reply guard refused nothing.
    assert.equal(metricSum(m, 'thaw_activator_redis_replies_refused_total'), 0, 'activator refused a real reply');
    assert.equal(sampleValue(await scaler.metrics(), 'thaw_scaler_redis_replies_refused_total'), 0,
      'scaler refused a real reply');
    await fa.stop();
    await fb.stop();
  } finally {
    await kA.stop();
    await kB.stop();
  }
});

test('thaw-scaler restarted under a KEDA StreamIsActive client: it reconnects and a wake reaches the new stream', async (t) => {
  const ref = scaledObjectRef('fp-so-c', { model: 'fp-c' });
  const k = kedaPushClient(scaler.address, ref);
  let fc = null;
  try {
    await waitUntil(() => k.open() === 1, 5000, { what: 'stream open' });
    await waitUntil(async () => sampleValue(await scaler.metrics(), 'thaw_scaler_active_streams') === 1,
      5000, { what: 'the scaler counts the stream' });

    const tStop = Date.now();
    const code = await scaler.stop('SIGTERM');
    assert.equal(code, 0, `thaw-scaler exit after SIGTERM; output:\n${scaler.proc.output().slice(-2000)}`);
    await waitUntil(() => k.attempts[0].code !== null, 3000, { what: 'the stream ended' });
    assert.equal(k.attempts[0].code, 0, `a clean end (OK), got ${JSON.stringify(k.attempts[0])}`);

    // Down for 3 s: KEDA's first retry (2 s after the clean end) finds nothing.
    await sleep(Math.max(0, 3000 - (Date.now() - tStop)));
    assert.ok(k.attempts.length >= 2, `a retry 2 s after the end: ${JSON.stringify(k.attempts)}`);
    assert.notEqual(k.attempts[1].code, 0, 'the retry while down fails');
    const gap1 = k.attempts[1].t - k.attempts[0].tEnd;
    assert.ok(gap1 >= 1900 && gap1 < 2800, `first retry ${gap1} ms after the clean end (KEDA: 2 s)`);
    const tStart = Date.now();
    scaler = await launchScaler();
    assert.equal(scaler.grpcPort, grpcPort);

    // The next retry (4 s after the failed one) reaches the new process.
    await waitUntil(() => k.open() === 1, 12000, { what: 'the stream reopened on the new scaler' });
    const reopened = k.attempts.at(-1);
    const gap2 = reopened.t - k.attempts.at(-2).tEnd;
    t.diagnostic(`attempts: ${k.attempts.map((a) => `+${a.t - tStop} ms code=${a.code}`).join(', ')}; ` +
      `reopened ${reopened.t - tStart} ms after the restart`);
    assert.ok(gap2 >= 3800 && gap2 < 5000, `second retry ${gap2} ms after the first failure (KEDA: 4 s)`);
    await waitUntil(async () => sampleValue(await scaler.metrics(), 'thaw_scaler_active_streams') === 1,
      5000, { what: 'the new scaler counts the stream' });
    await waitUntil(async () => (await numSub()) >= 1, 5000, { what: 'the new scaler subscribed to thaw:wake' });

    // A held request wakes the model through the new process.
    const since = k.pushes.length;
    const tReq = Date.now();
    const pending = Array.from({ length: 4 }, (_, i) => coldRequest('fp-c', i));
    const push = await k.waitPush((p) => p.result === true, 3000, { since });
    assert.equal(push.attempt, k.attempts.length - 1, 'pushed on the new stream');
    t.diagnostic(`wake pushed on the new stream ${push.t - tReq} ms after the request`);
    fc = await startFakeVllm({ model: 'fp-c', port: backendPort['fp-c'], loadDelayMs: 200 });
    assertServed(await Promise.all(pending), 'fp-c');
    const acc = await accountedFor(act);
    assert.equal(acc.outcomes.ok, acc.accepted, `only ok outcomes: ${JSON.stringify(acc)}`);
  } finally {
    await k.stop();
    await fc?.stop();
  }
});

test('Redis down: a cold model still wakes; the activator posts the wake to thaw-scaler and renews it until the model is ready', async (t) => {
  const port = await freePort();
  const deadPort = await freePort();
  const cfg = { models: [{ name: 'fp-d', backend: `http://127.0.0.1:${port}`, probeInitialMs: 20,
    probeMaxMs: 200, holdTimeoutSeconds: 120 },
  { name: 'fp-e', backend: `http://127.0.0.1:${deadPort}`, probeInitialMs: 20, probeMaxMs: 200,
    holdTimeoutSeconds: 3 }] };
  const direct = await startActivator(cfg, { redisUrl: redis.url, instanceId: 'act-direct',
    args: ['--redis-timeout-ms', '500', '--scaler-wake-url', `http://127.0.0.1:${scaler.httpPort}`] });
  const ref = scaledObjectRef('fp-so-d', { model: 'fp-d' });
  const k = kedaPushClient(scaler.address, ref);
  const wakes = async (result) => metricSum(await direct.metrics(), 'thaw_activator_scaler_wakes_total', { result });
  let fd = null;
  try {
    await waitUntil(() => k.open() === 1, 5000, { what: 'stream open' });
    // With Redis up a wake is posted once and not renewed: the held count in
    // Redis keeps the model wanted.
    const heldE = complete(direct.port, 'fp-e', { timeoutMs: 10000 });
    await waitUntil(async () => (await wakes('sent')) === 1, 2000, { what: 'the first post' });
    await sleep(2500);
    assert.equal(await wakes('sent'), 1, 'no renewal while Redis is up');
    assert.equal((await heldE).status, 504);
    await redis.kill();
    await waitUntil(async () => metricSum(await direct.metrics(), 'thaw_activator_redis_up') === 0, 5000,
      { what: 'the activator sees Redis down' });

    // The wake reaches KEDA's stream without Redis.
    const tReq = Date.now();
    const pending = Array.from({ length: 3 }, (_, i) => complete(direct.port, 'fp-d', { prompt: `d${i}`, timeoutMs: 60000 }));
    const push = await k.waitPush((p) => p.result === true, 3000);
    t.diagnostic(`wake pushed ${push.t - tReq} ms after the request, with Redis down`);
    // At once, not at the next once-a-second renewal.
    assert.ok(push.t - tReq < 300, `wake pushed ${push.t - tReq} ms after the request`);
    await direct.proc.waitForLog(/event=wake_signal_deferred model=fp-d/, 1000);

    // The posts carry this activator's held count: the scaler sizes the wake
    // by 3 requests, not 1, without Redis.
    await waitUntil(async () => (await scaler.model('fp-so-d'))?.inputs.heldRequests === 3, 3000,
      { what: 'the scaler reads 3 held from the posts' });
    // Renewed every second: past the scaler's held-fresh-seconds (5 s) a
    // replica is still wanted while the weights load.
    await sleep(7000);
    assert.deepEqual(await scaler.client.isActive(ref), { result: true });
    assert.ok((await getDesired(scaler.client, ref)).value >= 1);
    const sent = await wakes('sent') - 1;
    assert.ok(sent >= 6, `renewed about once a second: ${sent} posts in ~7 s`);
    assert.equal(await wakes('failed'), 0);
    assert.ok(sampleValue(await scaler.metrics(), 'thaw_scaler_http_wakes_total', { result: 'ok' }) >= sent);

    // The replica is up: the held requests are served and the renewals stop.
    fd = await startFakeVllm({ model: 'fp-d', port, loadDelayMs: 200 });
    assertServed(await Promise.all(pending), 'fp-d');
    const after = await wakes('sent');
    await sleep(2500);
    assert.equal(await wakes('sent'), after, 'no wake posts once the model is ready');
    const acc = await accountedFor(direct);
    assert.deepEqual(acc.outcomes, { ok: 3, hold_timeout: 1 });
  } finally {
    await k.stop();
    await fd?.stop();
    await direct.stop();
    await redis.restart();
  }
});

test('no Redis: the direct wake is renewed for a model a reload removed, and while the activator drains', async () => {
  const dead = await freePort();
  const m = (name) => ({ name, backend: `http://127.0.0.1:${dead}`, probeInitialMs: 20, probeMaxMs: 200,
    holdTimeoutSeconds: 60 });
  const act = await startActivator({ limits: { drainTimeoutSeconds: 12 }, models: [m('fp-r'), m('fp-s')] },
    { instanceId: 'act-renew', args: ['--scaler-wake-url', `http://127.0.0.1:${scaler.httpPort}`] });
  const refR = scaledObjectRef('fp-so-r', { model: 'fp-r' });
  const refS = scaledObjectRef('fp-so-s', { model: 'fp-s' });
  // What the scaler reads from the posts; a post counts for held-fresh-seconds (5 s).
  const heldAt = async (so) => (await scaler.model(so))?.inputs.heldRequests;
  let exited = false;
  try {
    // The targets exist from their first call (its answer may be UNAVAILABLE
    // while the scaler has no reading of Redis, which earlier tests restart).
    await scaler.client.isActive(refR).catch(() => {});
    await scaler.client.isActive(refS).catch(() => {});
    const r = complete(act.port, 'fp-r', { timeoutMs: 60000 }).catch((e) => ({ status: `error ${e.message}` }));
    const s = complete(act.port, 'fp-s', { timeoutMs: 60000 }).catch((e) => ({ status: `error ${e.message}` }));
    await waitUntil(async () => (await heldAt('fp-so-r')) === 1 && (await heldAt('fp-so-s')) === 1, 5000,
      { what: 'the scaler reads both held requests from the posts' });
    // fp-r removed: its held request still waits for its backend (up to its
    // hold deadline), so the scaler must go on being told.
    const since = act.proc.mark();
    act.writeConfig({ limits: { drainTimeoutSeconds: 12 }, models: [m('fp-s')] });
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(/event=config_reloaded/, 5000, { since });
    await sleep(7000);
    assert.equal(await heldAt('fp-so-r'), 1, 'renewed for the removed model past held-fresh-seconds');
    // Draining: the held requests wait up to drainTimeoutSeconds.
    act.proc.proc.kill('SIGTERM');
    await sleep(7000);
    assert.equal(await heldAt('fp-so-s'), 1, 'renewed while draining past held-fresh-seconds');
    assert.equal(await heldAt('fp-so-r'), 1, 'and for the removed one');
    const results = await Promise.all([r, s]);
    exited = true;
    for (const x of results) assert.equal(x.status, 503, `ended by the drain: ${x.status}`);
  } finally {
    if (!exited) await act.stop();
    else await act.proc.exited;
  }
});

test('Redis frozen (accepts connections, never answers): the link backs off, and the direct wake is renewed as when Redis is down', async (t) => {
  const frozen = await startRedis();
  const deadPort = await freePort();
  const fz = await startActivator({ limits: { drainTimeoutSeconds: 1 }, models: [{ name: 'fp-f',
    backend: `http://127.0.0.1:${deadPort}`, probeInitialMs: 20, probeMaxMs: 200, holdTimeoutSeconds: 60 }] },
  { redisUrl: frozen.url, instanceId: 'act-frozen',
    args: ['--redis-timeout-ms', '500', '--scaler-wake-url', `http://127.0.0.1:${scaler.httpPort}`] });
  const wakes = async () => metricSum(await fz.metrics(), 'thaw_activator_scaler_wakes_total', { result: 'sent' });
  let stopped = false;
  try {
    await waitUntil(async () => metricSum(await fz.metrics(), 'thaw_activator_redis_up') === 1, 5000,
      { what: 'Redis up' });
    // Caught: it is answered 503 at the drain below.
    const held = complete(fz.port, 'fp-f', { timeoutMs: 30000 }).catch((e) => ({ status: e.message }));
    await waitUntil(async () => (await wakes()) === 1, 2000, { what: 'the first post' });
    frozen.process.proc.kill('SIGSTOP');
    stopped = true;
    const mark = fz.proc.mark();
    const w0 = await wakes();
    await sleep(6000);
    const posts = (await wakes()) - w0;
    const ups = fz.proc.output().split('\n').slice(mark).filter((l) => /event=redis_up/.test(l)).length;
    t.diagnostic(`6 s frozen: ${posts} wake posts, ${ups} reconnections`);
    // Connected but unanswered counts as down for the renewal (it was 1 in
    // 5 s when only a refused connection did).
    assert.ok(posts >= 4, `${posts} posts in 6 s`);
    // The backoff grows (0.1, 0.2, 0.4 s...) instead of resetting at each
    // connect: 10 reconnections in 6 s at the 0.5 s timeout before.
    assert.ok(ups <= 6, `${ups} reconnections in 6 s`);
    frozen.process.proc.kill('SIGCONT');
    stopped = false;
    await fz.stop();
    assert.equal((await held).status, 503);
  } finally {
    if (stopped) frozen.process.proc.kill('SIGCONT');
    await fz.stop().catch(() => {});
    await frozen.stop();
  }
});

/** CPU ticks (utime + stime, 1/100 s) used by pid so far. */
function cpuTicks(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}

// accept() failing with EMFILE leaves the connection pending; without care
// the loop would spin at full CPU and flood stderr. common/grpc_server.c
// pauses accepting for 500 ms instead and logs once per pause.
test('thaw-scaler out of file descriptors: no busy loop, no log flood; serves again once descriptors are free',
  async (t) => {
    const s = await startScaler({ prometheusUrl: prom.url, redisUrl: redis.url, name: 'thaw-scaler-fds' });
    const socks = [];
    try {
      await s.client.waitForReady(5000);
      const fds = fs.readdirSync(`/proc/${s.proc.pid}/fd`).length;
      const err = await new Promise((resolve) => execFile('/usr/bin/prlimit',
        ['--pid', String(s.proc.pid), `--nofile=${fds + 20}:${fds + 20}`], (e) => resolve(e)));
      assert.ok(!err, `prlimit: ${err?.message}`);
      const mark = s.proc.mark();
      for (let i = 0; i < 60; i++) {
        const c = net.connect({ port: s.grpcPort, host: '127.0.0.1' });
        c.on('error', () => {});
        socks.push(c);
      }
      await sleep(300);
      const c0 = cpuTicks(s.proc.pid);
      await sleep(2000);
      const cpu = cpuTicks(s.proc.pid) - c0;
      const lines = s.proc.lines.length - mark;
      t.diagnostic(`at the limit: ${cpu * 10} ms CPU in 2 s, ${lines} log lines`);
      for (const c of socks) c.destroy();
      await sleep(300);
      assert.ok((await s.client.healthCheck('', { deadlineMs: 5000 })).status === 'SERVING', 'serves again');
      assert.ok(cpu <= 50, `${cpu * 10} ms of CPU in 2 s while out of descriptors`);
      assert.ok(lines < 100, `${lines} log lines in 2.3 s while out of descriptors`);
    } finally {
      for (const c of socks) c.destroy();
      await s.stop();
    }
  });
