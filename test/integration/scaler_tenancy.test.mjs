// Tenant safety of thaw-scaler: ScaledObject metadata is written by namespace
// tenants. Hostile names never reach PromQL (the scaler runs only the
// operator's query), Redis keys stay under the operator's prefix, namespaces
// outside the allow-list are refused, and hostile text cannot break a log
// line, the exposition or /models. Real redis-server, prometheus and exporter.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, test } from 'node:test';

import { startPrometheus, startRedis, waitUntil } from './lib/harness.mjs';
import {
  FAST_QUERY, parseExposition, sampleValue, scaledObjectRef, startFakeExporter, startScaler,
  waitDesired,
} from './lib/scaler_env.mjs';

const INVALID_ARGUMENT = 3;
const PERMISSION_DENIED = 7;
let redis;
let prom;
let exporter;
let scaler;
let client;

// PromQL and Redis injection attempts, quotes, braces, unicode, near-limit sizes.
const HOSTILE = [
  'm1"} or vector(100000) #',
  'm1\'} or on() vector(9)',
  '{model_name=~".+"}',
  'a b "c" \\d',
  'ümlaut-модель-模型',
  'x'.repeat(1024),
  '*',
  'thaw:held:*',
];

before(async () => {
  redis = await startRedis();
  exporter = await startFakeExporter({ m1: 3000 });
  prom = await startPrometheus({ scrapeTargets: [exporter.target], scrapeInterval: '1s' });
  scaler = await startScaler({
    prometheusUrl: prom.url,
    redisUrl: redis.url,
    flags: {
      'token-rate-query': FAST_QUERY,
      'allowed-namespaces': 'team-a, team-b',
      'redis-key-prefix': 'thaw:queue:', // the default, stated: FAST_FLAGS lifts it
    },
  });
  client = scaler.client;
  await client.waitForReady(5000);
});

after(async () => {
  if (scaler && scaler.proc.exitCode === null) {
    const code = await scaler.stop();
    assert.equal(code, 0, 'thaw-scaler exit code');
  }
});

test('hostile model names never change what Prometheus is asked', async () => {
  const real = scaledObjectRef('real', { model: 'm1' }, 'team-a');
  await waitDesired(client, real, 3, 30000);
  for (const [i, model] of HOSTILE.entries()) {
    const ref = scaledObjectRef(`h${i}`, { model }, 'team-a');
    const spec = await client.getMetricSpec(ref);
    assert.match(spec.metricSpecs[0].metricName, /^thaw-[a-z0-9-]*$/);
    const m = await client.getMetrics({ scaledObjectRef: ref, metricName: '' });
    // None of them is "m1", so none may see m1's 3000 tokens/s or any injected vector.
    assert.equal(m.metricValues[0].metricValueFloat, 0, `model ${JSON.stringify(model.slice(0, 40))}`);
  }
  // The scaler only ever sends the operator's query: one per interval, whatever the models.
  const samples = await scaler.metrics();
  const perModel = samples.filter((s) => s.name === 'thaw_scaler_input_token_rate');
  assert.ok(perModel.length >= HOSTILE.length + 1);
  assert.equal(sampleValue(samples, 'thaw_scaler_input_token_rate', { model: 'm1' }) > 2000, true);
});

test('hostile text cannot break the exposition, /models or the log', async () => {
  const text = await scaler.metricsText();
  const out = await new Promise((resolve) => {
    const child = execFile('/usr/bin/promtool', ['check', 'metrics'], (err, stdout, stderr) =>
      resolve({ code: err ? err.code : 0, output: stdout + stderr }));
    child.stdin.end(text);
  });
  assert.equal(out.code, 0, out.output);
  assert.equal(out.output.trim(), '');
  const parsed = parseExposition(text);
  assert.ok(parsed.some((s) => s.labels.model === HOSTILE[0]), 'label value round-trips');

  const models = await scaler.models();
  for (const model of HOSTILE) assert.ok(models.some((e) => e.model === model), `in /models: ${model.slice(0, 30)}`);

  // Every stderr line is one logfmt record: starts with ts= and quotes are balanced.
  for (const { line } of scaler.proc.lines) {
    assert.match(line, /^ts=\S+ level=(debug|info|warn|error) event=\w+/, line.slice(0, 200));
    const unescaped = line.replace(/\\./g, '');
    assert.equal((unescaped.match(/"/g) || []).length % 2, 0, `unbalanced quotes: ${line.slice(0, 200)}`);
  }
});

test('newlines, control characters and oversized values are refused, naming the key', async () => {
  const cases = [
    [{ model: 'm1\nlevel=error event=forged' }, /'model'/],
    [{ model: 'm1', redisKey: 'thaw:queue:x\r\nFLUSHALL' }, /'redisKey'|control/],
    [{ model: 'x'.repeat(1025) }, /'model'.*longer than/],
    [{ model: 'm1', targetQueueLength: '1'.repeat(2000) }, /'targetQueueLength'/],
  ];
  for (const [md, re] of cases) {
    await assert.rejects(client.isActive(scaledObjectRef('bad', md, 'team-a')), (err) => {
      assert.equal(err.code, INVALID_ARGUMENT);
      assert.match(err.details, re);
      return true;
    });
  }
});

test('redisKey must stay under the operator prefix', async () => {
  for (const key of ['thaw:held:m1', 'other-tenant:queue', 'session:*', '']) {
    await assert.rejects(client.isActive(scaledObjectRef('k', { model: 'm1', redisKey: key }, 'team-a')),
      (err) => err.code === INVALID_ARGUMENT && /redisKey/.test(err.details));
  }
  // Inside the prefix works and is read.
  await redis.cli('RPUSH', 'thaw:queue:team-a-jobs', ...Array.from({ length: 25 }, (_, i) => `j${i}`));
  const ok = scaledObjectRef('k-ok', { model: 'q-model', redisKey: 'thaw:queue:team-a-jobs' }, 'team-a');
  await waitDesired(client, ok, 3, 10000);
});

test('namespaces outside the allow-list are refused', async () => {
  for (const ns of ['team-c', 'kube-system', '', 'team-a,team-c']) {
    await assert.rejects(client.getMetricSpec(scaledObjectRef('n', { model: 'm1' }, ns)),
      (err) => err.code === PERMISSION_DENIED && /not allowed/.test(err.details));
  }
  const b = await client.isActive(scaledObjectRef('n', { model: 'm1' }, 'team-b'));
  assert.equal(b.result, true);
  await waitUntil(async () => (await scaler.models()).every((e) => ['team-a', 'team-b'].includes(e.namespace)),
    2000, { what: 'only allowed namespaces have targets' });
});
