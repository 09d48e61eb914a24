// idleSignal activators, end to end: thaw-activator publishes the requests it
// has in a backend (the fifth part of its thaw:held field), thaw-scaler reads
// them from a real Redis, and a ScaledObject with `idleSignal: activators`
// goes idle when the last request ends, while one on the token rate (the
// default) waits for a real Prometheus rate() to fall to zero, a window later.
// Both ScaledObjects scale the same model, so they see the same inputs.
import { after, before, test } from 'node:test';

import { assert, complete, startActivator, startFakeVllm, waitUntil } from './activator_lib.mjs';
import { startPrometheus, startRedis } from './lib/harness.mjs';
import { scaledObjectRef, startScaler } from './lib/scaler_env.mjs';

const MODEL = 'idle-m';
let redis;
let prom;
let vllm;
let act;
let scaler;

before(async () => {
  redis = await startRedis();
  // 40 tokens/s: a 120-token stream runs 3 s.
  vllm = await startFakeVllm({ model: MODEL, tokensPerSecond: 40, waitReady: true });
  prom = await startPrometheus({ scrapeTargets: [`127.0.0.1:${vllm.port}`] });
  // The first scrape lands seconds after the start; the rate needs it.
  await prom.waitForSeries(`vllm:generation_tokens_total{model_name="${MODEL}"}`);
  scaler = await startScaler({
    prometheusUrl: prom.url,
    redisUrl: redis.url,
    // A 30 s rate window: it shows the stream's tokens for about 30 s after it ends.
    flags: { 'token-rate-query': 'sum by (model_name) (rate(vllm:generation_tokens_total[30s]))' },
  });
  act = await startActivator({ models: [{ name: MODEL, backend: vllm.url, probeInitialMs: 20 }] },
    { redisUrl: redis.url, instanceId: 'act-idle' });
});

after(async () => {
  if (act) await act.stop();
  if (scaler) await scaler.stop();
  if (vllm) await vllm.stop();
});

const metadata = {
  model: MODEL, policy: 'v2', targetTokensPerSecond: 100, rateWindowSeconds: 30,
  // Keep warm for K = 1 x 2 s after going idle (no gap seen yet).
  coldStartSeconds: 2, keepWarmCost: 1,
};

test('idleSignal activators: idle when the last request ends, while the rate still shows it; tokenRate waits for the rate', async () => {
  const byActivators = scaledObjectRef('so-activators', { ...metadata, idleSignal: 'activators' });
  const byRate = scaledObjectRef('so-rate', metadata);
  for (const ref of [byActivators, byRate]) await scaler.client.getMetricSpec(ref);
  const active = async (ref) => (await scaler.client.isActive(ref)).result;
  const entry = (name) => scaler.model(name);
  assert.equal((await entry('so-activators')).policy.idleSignal, 'activators');
  assert.equal((await entry('so-rate')).policy.idleSignal, 'tokenRate');

  const stream = complete(act.port, MODEL, { maxTokens: 120, stream: true });
  // In flight: published within the activator's 1 s refresh, read by the scaler.
  await waitUntil(async () => (await entry('so-activators')).inputs.inflightRequests === 1, 3000,
    { what: 'the scaler sees 1 request in flight' });
  assert.equal(await active(byActivators), true);
  assert.equal(await active(byRate), true);
  const res = await stream;
  assert.equal(res.status, 200);
  const ended = Date.now();
  // The rate has seen the stream by now (1 s scrapes, 0.5 s queries).
  await waitUntil(async () => (await entry('so-rate')).inputs.tokenRate > 0, 5000,
    { what: 'the token rate shows the stream' });

  // The activator shows a request for two 1 s refreshes after it ends, the
  // policy waits 2 s of nothing carried, then the 2 s keep-warm: about 6 s.
  await waitUntil(async () => !(await active(byActivators)), 15000,
    { what: 'idleSignal activators inactive after the last request' });
  const idleAfter = Date.now() - ended;
  const [a, r] = await Promise.all([entry('so-activators'), entry('so-rate')]);
  assert.equal(a.inputs.inflightRequests, 0);
  assert.equal(a.desired, 0);
  // The same inputs, the rate still above zero: the token-rate target stays up.
  assert.ok(r.inputs.tokenRate > 0, `token rate ${r.inputs.tokenRate} when the activators said idle`);
  assert.equal(await active(byRate), true, 'tokenRate target still active');
  assert.ok(idleAfter < 12000, `idle ${idleAfter} ms after the end (2 refreshes + 2 s + 2 s keep-warm)`);
  // The decision that went inactive (not the target's first one, also inactive).
  const lines = scaler.proc.lines.filter((l) => l.line.includes('event=decision') &&
    l.line.includes('scaledobject=so-activators'));
  const wentIdle = lines[lines.length - 1]?.line ?? '';
  assert.match(wentIdle, /active=false/);
  assert.match(wentIdle, /previous=[1-9]\d* /);
  assert.match(wentIdle, /inflight=0 /);
});
