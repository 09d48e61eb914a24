// thaw-activator peers: activators sharing a Redis share each endpoint's
// maxConcurrencyPerEndpoint, so two activators in front of one vLLM replica
// send it at most its batch, not twice that (the excess would wait in vLLM's
// own queue, out of the scaler's sight). Real Redis, real fake vLLM (batch 4,
// so requests over 4 show as vllm:num_requests_waiting), two activators.
import { after, before, test } from 'node:test';

import {
  assert, complete, parseMetrics, request, sleep, startActivator, startFakeVllm, waitUntil,
} from './activator_lib.mjs';
import { startRedis } from './lib/harness.mjs';

const CAP = 4;
let redis;
let vllm;

before(async () => {
  redis = await startRedis();
  vllm = await startFakeVllm({ model: 'm1', maxBatch: CAP, tokensPerSecond: 10, waitReady: true });
});

after(async () => {
  await vllm?.stop();
});

function config(split, names = ['m1']) {
  return {
    models: names.map((name) => ({
      name, backend: vllm.url, probeInitialMs: 5, probeMaxMs: 20,
      maxConcurrencyPerEndpoint: CAP, splitConcurrencyAcrossActivators: split,
    })),
  };
}

/** Requests vLLM holds now: running in its batch plus waiting for a slot. */
async function vllmLoad() {
  const m = parseMetrics((await request(vllm.port, { path: '/metrics' })).body.toString());
  const get = (n) => [...m].filter(([k]) => k.startsWith(n)).reduce((s, [, v]) => s + v, 0);
  return { running: get('vllm:num_requests_running'), waiting: get('vllm:num_requests_waiting') };
}

/** Sends perActivator requests of 10 tokens (about 1 s each) through every
 * activator at once and samples vLLM's load until all are answered. */
async function burst(acts, perActivator) {
  const reqs = acts.flatMap((a) => Array.from({ length: perActivator },
    () => complete(a.port, 'm1', { maxTokens: 10 })));
  let done = false;
  const all = Promise.all(reqs).finally(() => { done = true; });
  let peak = 0, peakRunning = 0, peakWaiting = 0;
  while (!done) {
    const l = await vllmLoad();
    peak = Math.max(peak, l.running + l.waiting);
    peakRunning = Math.max(peakRunning, l.running);
    peakWaiting = Math.max(peakWaiting, l.waiting);
    await sleep(50);
  }
  const res = await all;
  assert.deepEqual(res.map((r) => r.status), res.map(() => 200));
  return { peak, peakRunning, peakWaiting };
}

async function peersOf(a) {
  return (await a.models()).peers;
}

test('two activators split the cap: vLLM never gets more than its batch; the split ends with a peer and with Redis', async () => {
  const a = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-a' });
  const b = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-b' });
  let bStopped = false;
  try {
    // Warm the model on both (first request wakes it; the backend is up).
    assert.equal((await complete(a.port, 'm1')).status, 200);
    assert.equal((await complete(b.port, 'm1')).status, 200);
    await waitUntil(async () => (await peersOf(a)) === 2 && (await peersOf(b)) === 2, 5000,
      { what: 'both activators count 2 peers' });
    assert.equal((await a.model('m1')).capPerEndpoint, CAP / 2);
    assert.equal(parseMetrics(await a.metricsText()).get('thaw_activator_peers'), 2);
    const members = (await redis.cli('ZRANGE', 'thaw:activators:default', '0', '-1')).split('\n');
    assert.deepEqual(members.sort(), ['act-a', 'act-b']);
    // A member without a weight (an activator from before weights) counts
    // whole; a member stamped more than 5 s ago is gone, weight and all.
    const [sec, usec] = (await redis.cli('TIME')).split('\n').map(Number);
    const nowMs = sec * 1000 + Math.floor(usec / 1000);
    await redis.cli('ZADD', 'thaw:activators:default', String(nowMs), 'act-old');
    await waitUntil(async () => (await peersOf(a)) === 3, 3000, { what: 'the unweighted member counted whole' });
    // Weight first: a heartbeat between the two calls must not drop the
    // member before its weight exists.
    await redis.cli('HSET', 'thaw:activators:default:w', 'act-old', '1000');
    await redis.cli('ZADD', 'thaw:activators:default', String(nowMs - 60000), 'act-old');
    await waitUntil(async () => (await peersOf(a)) === 2, 3000, { what: 'the stale member dropped' });
    assert.equal(await redis.cli('HEXISTS', 'thaw:activators:default:w', 'act-old'), '0');

    // 8 at once through each: each sends 2, queues the rest; vLLM runs 4 and
    // queues none.
    const split = await burst([a, b], 8);
    assert.equal(split.peakWaiting, 0, `vLLM queued requests behind its batch: ${JSON.stringify(split)}`);
    assert.ok(split.peak <= CAP, JSON.stringify(split));
    assert.equal(split.peakRunning, CAP, `both activators used their share: ${JSON.stringify(split)}`);

    // The same burst with the split off (reloaded config): each activator
    // sends its full cap, so vLLM gets twice its batch and queues half.
    a.writeConfig(config(false));
    b.writeConfig(config(false));
    a.proc.proc.kill('SIGHUP');
    b.proc.proc.kill('SIGHUP');
    await waitUntil(async () => (await a.model('m1')).capPerEndpoint === CAP &&
      (await b.model('m1')).capPerEndpoint === CAP, 5000, { what: 'split off after reload' });
    const unsplit = await burst([a, b], 8);
    assert.ok(unsplit.peakWaiting >= CAP / 2, `without the split vLLM should queue: ${JSON.stringify(unsplit)}`);

    // Split on again, with a model added by the reload: it gets the share too.
    a.writeConfig(config(true, ['m1', 'm1-alias']));
    b.writeConfig(config(true));
    a.proc.proc.kill('SIGHUP');
    b.proc.proc.kill('SIGHUP');
    await waitUntil(async () => (await a.model('m1')).capPerEndpoint === CAP / 2 &&
      (await b.model('m1')).capPerEndpoint === CAP / 2, 5000, { what: 'split on again' });
    assert.equal((await a.model('m1-alias')).capPerEndpoint, CAP / 2);

    // A draining peer counts for the part of its share its requests still
    // use (its requests and the other's together stay within the batch):
    // b, running 1 of its 2, counts half, so a's share is ceil(4 / 1.5) = 3
    // while b drains. Once drained b leaves at once: a takes the whole cap
    // within a heartbeat, not a TTL later. (8 s requests: the drain outlasts
    // the 5 s a silent member stays counted.)
    const running = complete(b.port, 'm1', { maxTokens: 80 });
    await waitUntil(async () => (await vllmLoad()).running === 1, 3000, { what: 'one running via b' });
    const stopping = b.stop('SIGTERM', 20000);
    const stoppedAt = Date.now();
    bStopped = true;
    await waitUntil(async () => (await a.model('m1')).capPerEndpoint === 3, 3000,
      { what: "a's share widened to 3 while b drains" });
    assert.equal(await peersOf(a), 1.5);
    assert.equal(await redis.cli('HGET', 'thaw:activators:default:w', 'act-b'), '500');
    assert.equal(await redis.cli('HGET', 'thaw:activators:default:w', 'act-a'), '1000');
    // a's 3 and b's 1: vLLM runs its whole batch and queues nothing.
    const mixed = await burst([a], 6);
    assert.equal(mixed.peakWaiting, 0, `vLLM queued requests behind its batch: ${JSON.stringify(mixed)}`);
    assert.equal(mixed.peakRunning, CAP, JSON.stringify(mixed));
    await sleep(Math.max(0, 6500 - (Date.now() - stoppedAt)));
    assert.equal(await peersOf(a), 1.5, 'b still counted, for half, while it drains');
    assert.equal((await running).status, 200);
    await stopping;
    const t0 = Date.now();
    await waitUntil(async () => (await a.model('m1')).capPerEndpoint === CAP, 3000,
      { what: 'whole cap after the peer left' });
    assert.ok(Date.now() - t0 < 3000);
    assert.match(a.proc.output(), /event=peers_changed peers=1.5 was=2 reason=counted/);
    assert.match(a.proc.output(), /event=peers_changed peers=1 was=1.5 reason=counted/);
    assert.equal(await redis.cli('HEXISTS', 'thaw:activators:default:w', 'act-b'), '0', 'its weight left with it');
  } finally {
    if (!bStopped) await b.stop();
    await a.stop();
  }
});

test('Redis gone: after 5 s without a count each activator takes the whole cap again; held requests go out', async () => {
  const a = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-c' });
  const b = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-d' });
  try {
    assert.equal((await complete(a.port, 'm1')).status, 200);
    await waitUntil(async () => (await peersOf(a)) === 2, 5000, { what: 'two peers' });
    // A queue at the split cap: 2 sent, 2 waiting at the activator.
    const reqs = Array.from({ length: 4 }, () => complete(a.port, 'm1', { maxTokens: 80 }));
    await waitUntil(async () => (await a.model('m1')).held === 2, 3000, { what: '2 queued at the share' });
    await redis.stop();
    const t0 = Date.now();
    // The queued requests go out once the split ends (5 s without a count),
    // while the first two (8 s each) still run: not because they finished.
    await waitUntil(async () => (await a.model('m1')).held === 0, 9000, { what: 'queue sent after the split ended' });
    const waited = Date.now() - t0;
    assert.equal((await vllmLoad()).running, 4, 'all four run at once');
    assert.ok(waited >= 3000 && waited < 6500, `split ended after ${waited} ms`);
    assert.equal((await a.model('m1')).capPerEndpoint, CAP);
    assert.match(a.proc.output(), /event=peers_changed peers=1 was=2 reason=no_recent_count/);
    const res = await Promise.all(reqs);
    assert.deepEqual(res.map((r) => r.status), res.map(() => 200));
  } finally {
    await b.stop();
    await a.stop();
    await redis.restart();
  }
});

test('a drain that begins without a count (Redis down): the drainer counts whole until a count says what a live share is, and its own share narrows', async () => {
  const a = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-e' });
  const b = await startActivator(config(true), { redisUrl: redis.url, instanceId: 'act-f' });
  let bStopped = false;
  try {
    assert.equal((await complete(a.port, 'm1')).status, 200);
    assert.equal((await complete(b.port, 'm1')).status, 200);
    await waitUntil(async () => (await peersOf(a)) === 2 && (await peersOf(b)) === 2, 5000, { what: 'two peers' });
    await redis.stop();
    await waitUntil(async () => (await b.model('m1')).capPerEndpoint === CAP && (await a.model('m1')).capPerEndpoint === CAP,
      9000, { what: 'both take the whole cap without a count' });
    // b runs 2 (16 s each) on its whole cap, then drains; Redis comes back.
    const running = [complete(b.port, 'm1', { maxTokens: 160, timeoutMs: 30000 }),
      complete(b.port, 'm1', { maxTokens: 160, timeoutMs: 30000 })];
    await waitUntil(async () => (await vllmLoad()).running === 2, 3000, { what: 'two running via b' });
    const stopping = b.stop('SIGTERM', 40000);
    bStopped = true;
    await redis.restart();
    // Measured against its stale whole cap, b's 2 would weigh half and a
    // would take 3: 5 on a batch of 4. Counted as a live peer's share (2),
    // they are all of it.
    // Right after the restart a count can miss a peer that has not
    // heartbeated yet (each reconnects with its own backoff; for everyone, as
    // before weights), and a weight measured from it is too small for one
    // heartbeat: wait for a steady 2 (3 s in a row; the code before this fix
    // settles at 1.5).
    let since = null;
    await waitUntil(async () => {
      if ((await peersOf(a)) !== 2) since = null;
      else since ??= Date.now();
      return since !== null && Date.now() - since >= 3000;
    }, 12000, { what: 'a counts b whole for 3 s in a row' });
    assert.equal(await redis.cli('HGET', 'thaw:activators:default:w', 'act-f'), '1000');
    const mixed = await burst([a], 6);
    assert.equal(mixed.peakWaiting, 0, `vLLM queued requests behind its batch: ${JSON.stringify(mixed)}`);
    assert.ok(mixed.peak <= CAP, JSON.stringify(mixed));
    assert.match(b.proc.output(), /event=peers_changed peers=2 was=1 reason=counted/);
    assert.deepEqual((await Promise.all(running)).map((r) => r.status), [200, 200]);
    await stopping;
    await waitUntil(async () => (await a.model('m1')).capPerEndpoint === CAP, 3000, { what: 'whole cap after b left' });
  } finally {
    if (!bStopped) await b.stop();
    await a.stop();
  }
});
