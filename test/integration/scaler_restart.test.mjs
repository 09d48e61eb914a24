// A thaw-scaler asked about a ScaledObject new to it (after a restart, or when
// KEDA fails over from another replica) reads back from Prometheus what was
// last reported for it (--restore-window-seconds), so the switch does not
// undo the scale-down window the other process held: the replicas a busy
// model had are held for that window, then the demand decides again. Real
// Prometheus scraping the first scaler's /metrics; real processes stopped.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startPrometheus, startRedis, waitUntil } from './lib/harness.mjs';
import {
  FAST_QUERY, getDesired, sampleValue, scaledObjectRef, sleep, startFakeExporter, startScaler,
  waitDesired,
} from './lib/scaler_env.mjs';

const WINDOW_S = 12; // the ScaledObjects' scale-down window (policy v1: one window)

let exporter;
let prom;
let redis;
const scalers = [];

before(async () => {
  exporter = await startFakeExporter({ busy: 2500, gone: 2500, steady: 300 });
  [prom, redis] = await Promise.all([
    startPrometheus({ scrapeTargets: [exporter.target], scrapeInterval: '1s' }),
    startRedis(),
  ]);
});

after(async () => {
  for (const s of scalers) {
    if (s.proc.exitCode !== null) continue;
    const code = await s.stop();
    assert.equal(code, 0, `thaw-scaler exit code; output:\n${s.proc.output().slice(-3000)}`);
  }
});

async function scaler(name, flags) {
  const s = await startScaler({
    name,
    prometheusUrl: prom.url,
    redisUrl: redis.url,
    flags: { 'scale-down-stabilization-seconds': WINDOW_S, ...flags },
  });
  scalers.push(s);
  await s.client.waitForReady(5000);
  return s;
}

const ref = scaledObjectRef('busy', { model: 'busy', targetTokensPerSecond: 500 });
const goneRef = scaledObjectRef('gone', { model: 'gone', targetTokensPerSecond: 500 });
const steadyRef = scaledObjectRef('steady', { model: 'steady', targetTokensPerSecond: 500 });

/** Waits until GetMetrics reports at least `least` (5 s of 1 s scrapes read
 *  a rate up to about 20 % high: 2500/500 may show as 6). */
async function waitAtLeast(client, r, least) {
  return waitUntil(async () => (await getDesired(client, r)).value >= least, 15000,
    { intervalMs: 100, what: `desired >= ${least} for ${r.name}` });
}

test('a scaler new to a busy model holds the replicas last reported for the scale-down window, then follows the demand', async (t) => {
  const first = await scaler('thaw-scaler-first', { 'restore-window-seconds': 60 });
  await waitAtLeast(first.client, ref, 5); // 2500 tokens/s over 500
  await waitAtLeast(first.client, goneRef, 5);
  await prom.setScrapeTargets([exporter.target, `127.0.0.1:${first.httpPort}`]);
  await prom.waitForSeries('thaw_scaler_desired_replicas{namespace="default",scaledobject="busy"} >= 5');
  // A model that goes idle and is let go to zero before the switch: its
  // last answer is 0, though it had 5 within the window.
  await exporter.setRate('gone', 0);
  await waitDesired(first.client, goneRef, 0, (WINDOW_S + 10) * 1000);
  await prom.waitForSeries('thaw_scaler_desired_replicas{scaledobject="gone"} == 0');
  assert.ok(Number((await prom.query(
    'max_over_time(thaw_scaler_desired_replicas{scaledobject="gone"}[60s])')).data.result[0].value[1]) >= 5);

  // A second replica, running but never asked about these models, and one
  // that does not read back. Then the first goes away (KEDA would reconnect
  // to another replica, or to the first one restarted: the same for it).
  const [second, forgetful] = await Promise.all([
    scaler('thaw-scaler-second', { 'restore-window-seconds': 60 }),
    scaler('thaw-scaler-forgetful', { 'restore-window-seconds': 0 }),
  ]);
  assert.equal(await first.stop(), 0);

  // The demand falls meanwhile: one replica's worth (rate() over 5 s of 1 s
  // scrapes reads up to about 20 % high).
  await exporter.setRate('busy', 300);
  await prom.waitForSeries(FAST_QUERY,
    (r) => r.some((x) => x.metric.model_name === 'busy' && Number(x.value[1]) < 400));
  // What the first scaler reported last (its window may hold a 6 from a
  // high reading): the second must hold that.
  const before = Number((await prom.query(
    'last_over_time(thaw_scaler_desired_replicas{scaledobject="busy"}[60s])')).data.result[0].value[1]);
  assert.ok(before >= 5, `the first scaler reported ${before}`);

  // As KEDA does: GetMetricSpec first (it creates the target and does not
  // wait), then GetMetrics once the read-back is in (a loaded machine could
  // otherwise pass the 2 s a first GetMetrics waits).
  const started = Date.now();
  await second.client.getMetricSpec(ref);
  await second.proc.waitForLog(/event=restore_done targets=1 floors=1 reported=1 skipped=0/);
  const answers = [];
  let droppedAt = null;
  while (Date.now() - started < (WINDOW_S + 10) * 1000) {
    const v = (await getDesired(second.client, ref)).value;
    answers.push(v);
    if (v === 1) {
      droppedAt = Date.now() - started;
      break;
    }
    assert.equal(v, before, `held at the reported ${before} until the window ends; answers ${answers}`);
    await sleep(250);
  }
  t.diagnostic(`held ${before} replicas for ${droppedAt} ms after GetMetricSpec (window ${WINDOW_S} s), ` +
    `${answers.length} GetMetrics answers`);
  assert.equal(answers[0], before, 'the first answer is the one read back');
  assert.ok(droppedAt !== null, `still not at the demand ${WINDOW_S + 10} s after the first call`);
  // The hold runs from the read-back, which answers the first call.
  assert.ok(droppedAt >= (WINDOW_S - 2) * 1000 && droppedAt <= (WINDOW_S + 3) * 1000,
    `dropped to the demand ${droppedAt} ms after the first call, window ${WINDOW_S} s`);
  assert.equal((await getDesired(forgetful.client, ref)).value, 1,
    'without the read-back the model drops to its current demand at once');
  assert.equal((await getDesired(second.client, goneRef)).value, 0, 'a model gone to zero stays there');
  assert.equal((await second.client.isActive(goneRef)).result, false);

  assert.equal(sampleValue(await second.metrics(), 'thaw_scaler_restored_floors_total'), 1);
  assert.equal(sampleValue(await forgetful.metrics(), 'thaw_scaler_restored_floors_total'), 0);
  await second.proc.waitForLog(/event=restore_done targets=1 floors=0 reported=1 skipped=0/);
  const lines = second.proc.lines.map((l) => l.line)
    .filter((l) => l.includes('event=decision') && l.includes(' scaledobject=busy '));
  assert.ok(lines.some((l) => new RegExp(` desired=${before} .* reason=restored `).test(l)),
    `the why, in the log:\n${lines.join('\n')}`);
  assert.ok(lines.some((l) => new RegExp(` desired=1 previous=${before} .* direction=down `).test(l)));
});

test('Prometheus without the series: nothing is restored, and the current demand is answered', async () => {
  const s = await scaler('thaw-scaler-fresh', {
    'restore-window-seconds': 60, 'restore-series': 'thaw_scaler_desired_replicas{job="none"}',
  });
  assert.equal((await getDesired(s.client, steadyRef)).value, 1, '300 tokens/s over 500');
  await s.proc.waitForLog(/event=restore_done targets=1 floors=0 reported=0 skipped=0/);
});

test('a bad --restore-series stops the start with a clear error', async () => {
  await assert.rejects(scaler('thaw-scaler-bad', { 'restore-series': 'sum(thaw_scaler_desired_replicas)' }),
    /restore-series must be a metric name/);
});

test('option values that would fail every query or call stop the start with a clear error', async () => {
  await assert.rejects(scaler('thaw-scaler-bad', { 'restore-window-seconds': 0.0001 }),
    /--restore-window-seconds: expected 0 \(off\) or at least 1, got 0.0001/);
  await assert.rejects(scaler('thaw-scaler-bad', { 'token-rate-query': ' ' }), /--token-rate-query: empty/);
  await assert.rejects(scaler('thaw-scaler-bad', { 'token-rate-label': 'model-name' }),
    /--token-rate-label: expected a Prometheus label name/);
  await assert.rejects(scaler('thaw-scaler-bad', { 'allowed-namespaces': ' , ' }),
    /--allowed-namespaces: no namespace/);
  await assert.rejects(scaler('thaw-scaler-bad', { 'tls-reload-interval-seconds': 0.0000005 }),
    /--tls-reload-interval-seconds: expected 0 \(off\) or at least 0.001/);
});
