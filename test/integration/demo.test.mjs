// End-to-end test of the local demo (scripts/demo.mjs): the whole stack
// (redis-server, prometheus, thaw-scaler, thaw-activator, the KEDA/HPA
// cluster driver, fake vLLM replicas) replays a synthetic trace this test
// writes, bounded to well under two minutes, and the run's report must show
// zero lost or failed requests, a scale from zero whose held requests were
// released, a scale-up under the burst and a return to zero once idle.
//
// THAW_DEMO_EXTRA_ARGS (space-separated) is appended to the demo's command
// line, e.g. "--no-activator" to exercise the driver while the activator is
// not built; the test then says so in its output.

import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { repoRoot, tmpDir } from './lib/harness.mjs';
import { hpaNormalize, hpaProposal, defaultBehavior, metricNumber } from '../../scripts/demo/cluster.mjs';
import { buildSchedule, parseTimestamp, parseTrace } from '../../scripts/demo/trace.mjs';

const extraArgs = (process.env.THAW_DEMO_EXTRA_ARGS ?? '').split(/\s+/).filter(Boolean);

/**
 * A trace in the Azure format with plain-second timestamps: a trickle that
 * wakes the model (held during the cold start), a 20 s burst far above what
 * one replica decodes, then silence (the run lasts until scale to zero).
 */
function syntheticTrace() {
  const rows = ['TIMESTAMP,ContextTokens,GeneratedTokens'];
  for (let i = 0; i < 4; i++) rows.push(`${(i * 0.4).toFixed(3)},${200 + i * 50},40`);
  // Burst: 10 requests/s of 120 tokens = 1200 tokens/s demand.
  for (let i = 0; i < 200; i++) rows.push(`${(3 + i * 0.1).toFixed(3)},${300 + (i % 7) * 100},120`);
  return `${rows.join('\n')}\n`;
}

function runDemo(args, timeoutMs) {
  return new Promise((resolve) => {
    // Without NODE_TEST_CONTEXT: the demo is a program, not a test file.
    const env = { ...process.env };
    delete env.NODE_TEST_CONTEXT;
    const child = spawn(process.execPath, [path.join(repoRoot, 'scripts', 'demo.mjs'), ...args], {
      cwd: repoRoot, env, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out });
    });
  });
}

/** Pids of processes whose command line mentions dir. */
function processesUsing(dir) {
  const hits = [];
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
      if (cmd.includes(dir)) hits.push(`${pid}: ${cmd.slice(0, 200)}`);
    } catch { /* gone meanwhile */ }
  }
  return hits;
}

test('the local demo replays a burst: nothing lost, scale from zero, up, and back to zero', { timeout: 170000 }, async (t) => {
  const dir = tmpDir('thaw-demo-test-');
  const trace = path.join(dir, 'burst.csv');
  fs.writeFileSync(trace, syntheticTrace());
  const out = path.join(dir, 'out');
  const started = Date.now();
  const res = await runDemo([
    '--trace', trace, '--models', '1', '--speedup', '1', '--duration', '115', '--out', out,
    '--cold-start-seconds', '2', '--weights-mb', '16',
    '--tokens-per-second', '100', '--max-batch', '4', '--target-tokens-per-second', '200',
    '--max-replicas', '4', '--polling-interval', '1', '--hpa-sync', '1', '--cooldown', '6',
    '--scaler-stabilization', '3', '--rate-window', '5s', '--tail-seconds', '5', '--quiet',
    ...extraArgs,
  ], 160000);
  const wall = (Date.now() - started) / 1000;
  t.diagnostic(`demo exited with ${res.code} after ${wall.toFixed(1)} s; output:`);
  for (const line of res.out.trimEnd().split('\n')) t.diagnostic(line);
  if (extraArgs.length) t.diagnostic(`extra demo arguments: ${extraArgs.join(' ')}`);
  assert.equal(res.code, 0, `demo exit code (signal ${res.signal})`);
  assert.ok(wall < 135, `the run is bounded (took ${wall} s)`);

  const report = JSON.parse(fs.readFileSync(path.join(out, 'report.json'), 'utf8'));
  const tot = report.totals;
  // Well-formed: every promised figure is there and has the right type.
  for (const k of ['requestsSent', 'answered', 'succeeded', 'failed', 'lost', 'heldRequests', 'coldStarts', 'replicaStarts', 'tokens', 'replicaSeconds']) {
    assert.equal(typeof tot[k], 'number', `totals.${k} is a number`);
  }
  assert.equal(typeof tot.failedByStatus, 'object');
  for (const k of ['holdMs', 'ttftMs', 'totalMs']) {
    assert.equal(typeof tot[k].p50, 'number', `${k}.p50`);
    assert.equal(typeof tot[k].p99, 'number', `${k}.p99`);
    assert.ok(tot[k].p99 >= tot[k].p50, `${k} p99 >= p50`);
  }
  assert.ok(tot.replicaSecondsPerMillionTokens > 0);
  assert.ok(Math.abs(tot.replicaSecondsPerMillionTokens - tot.replicaSeconds / (tot.tokens / 1e6)) < 1);
  assert.equal(report.endReason, 'completed', 'the run ended on its own (not cut by --duration)');
  assert.equal(report.mode, extraArgs.includes('--no-activator') ? 'no-activator' : 'activator');

  // Zero lost, zero failed, everything sent.
  assert.equal(report.scheduled, 204);
  assert.equal(tot.requestsSent, 204);
  assert.equal(tot.lost, 0, `lost: ${JSON.stringify(tot.lostByReason)}`);
  assert.equal(tot.failed, 0, `failed: ${JSON.stringify(tot.failedByStatus)}`);
  assert.equal(tot.succeeded, 204);
  assert.equal(tot.answered, tot.requestsSent - tot.lost);
  // Each request asked for a known number of tokens and got them all.
  assert.equal(tot.tokens, 4 * 40 + 200 * 120);

  // Scale from zero with held requests released.
  const m = report.models['llama-8b'];
  assert.ok(m, 'model llama-8b in the report');
  assert.ok(m.scaling.scaleFromZero >= 1, 'scaled from zero');
  assert.ok(tot.heldRequests >= 1, 'requests were held during the cold start');
  assert.equal(tot.heldSucceeded, tot.heldRequests, 'every held request succeeded');
  // The first request waited for the whole cold start (2 s of weights and
  // delay) and, with nothing ahead of it, went out soon after. Later held
  // requests also wait for a free batch slot: when the burst starts after
  // the first replica is ready, some wait 14 s behind its 4 slots until
  // more replicas come (about one run in seven), so the bound is the
  // first one's.
  assert.ok(tot.holdMs.max >= 1500, `held as long as a cold start (max ${tot.holdMs.max} ms)`);
  const requests = fs.readFileSync(path.join(out, 'requests.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const first = requests.filter((r) => r.held).sort((a, b) => a.sentAt - b.sentAt)[0];
  assert.ok(first.holdMs >= 1500 && first.holdMs < 15000,
    `the first request was released soon after the replica was ready (held ${first.holdMs} ms)`);
  // Scale up under the burst, then back to zero.
  assert.ok(m.scaling.maxReady >= 2, `scaled up under the burst (max ready ${m.scaling.maxReady})`);
  assert.ok(m.scaling.scaleToZero >= 1, 'scaled to zero once idle');
  assert.equal(m.scaling.endedAtZero, true);
  assert.ok(report.checks.noLostRequests && report.checks.noFailedRequests && report.checks.scaledUpUnderLoad &&
    report.checks.returnedToZero && report.checks.scaledFromZeroAndReleasedHeld, JSON.stringify(report.checks));
  assert.ok(report.kedaCalls.GetMetrics > 0 && report.kedaCalls.IsActive > 0 && report.kedaCalls.StreamIsActive >= 1);

  assert.deepEqual(report.unexpectedExits, [], 'every process exited with 0');
  assert.ok(Object.keys(report.processExits).some((n) => n.startsWith('replica-')), 'replica exits recorded');

  // The activator's own counters agree with what the clients saw.
  if (report.mode === 'activator') {
    assert.equal(report.activator.accepted, 204, 'requests the activator accepted');
    assert.equal(report.activator.outcomes['llama-8b']?.ok, 204, `activator outcomes ${JSON.stringify(report.activator.outcomes)}`);
  }

  // The other outputs.
  const svg = fs.readFileSync(path.join(out, 'timeline.svg'), 'utf8');
  assert.match(svg, /^<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  assert.match(svg, /<\/svg>\n$/);
  assert.match(svg, /llama-8b/);
  const lines = fs.readFileSync(path.join(out, 'requests.jsonl'), 'utf8').trim().split('\n');
  assert.equal(lines.length, 204);
  assert.match(res.out, /requests: 204 sent, 204 succeeded, 0 failed, 0 lost/);

  // Nothing it started is still running.
  const work = path.dirname(report.config.replicaArgs[report.config.replicaArgs.indexOf('--weights-file') + 1]);
  assert.deepEqual(processesUsing(work), [], 'no process of the demo is left');
});

test('cluster driver: HPA AverageValue arithmetic, tolerance, behavior limits', () => {
  // ceil(value / target) outside the 10 % tolerance band, current count inside it.
  assert.equal(hpaProposal(3, 1, 1), 3);
  assert.equal(hpaProposal(0, 1, 2), 0);
  assert.equal(hpaProposal(10.5, 1, 10), 10, '5 % above target: within tolerance');
  assert.equal(hpaProposal(11.5, 1, 10), 12, '15 % above target: scale');
  assert.equal(hpaProposal(2.5, 1, 0), 3);
  // KEDA's reading of values: float wins when > 0; NaN and negatives are 0.
  assert.equal(metricNumber(2.5, 7), 2.5);
  assert.equal(metricNumber(0, 4), 4);
  assert.equal(metricNumber(NaN, -1), 0);

  const behavior = defaultBehavior(15000);
  const base = { recs: [], events: [], now: 100000, behavior, minReplicas: 1, maxReplicas: 20 };
  // Scale-up limit: max(100 %, 4 pods) per period.
  assert.deepEqual(hpaNormalize({ ...base, proposal: 12, current: 2 }), { desired: 6, reason: 'scale_up_limit' });
  assert.deepEqual(hpaNormalize({ ...base, proposal: 12, current: 5 }), { desired: 10, reason: 'scale_up_limit' });
  // Replicas added earlier in the period count against the limit.
  assert.equal(hpaNormalize({ ...base, proposal: 12, current: 6, events: [{ t: 95000, delta: 4 }] }).desired, 6);
  assert.equal(hpaNormalize({ ...base, proposal: 12, current: 6, events: [{ t: 80000, delta: 4 }] }).desired, 12);
  // min/max replicas.
  assert.deepEqual(hpaNormalize({ ...base, proposal: 0, current: 3 }), { desired: 1, reason: 'min_replicas' });
  assert.deepEqual(hpaNormalize({ ...base, proposal: 30, current: 16 }), { desired: 20, reason: 'max_replicas' });
  // A scale-down stabilization window keeps the highest recent recommendation.
  const slow = { ...behavior, scaleDown: { ...behavior.scaleDown, stabilizationMs: 300000 } };
  assert.equal(hpaNormalize({ ...base, behavior: slow, proposal: 2, current: 5, recs: [{ t: 90000, r: 4 }] }).desired, 4);
  assert.equal(hpaNormalize({ ...base, behavior: slow, proposal: 2, current: 5, recs: [{ t: 90000, r: 7 }] }).desired, 5);
});

test('trace: Azure timestamps, slicing, speedup, caps and spreading over models', () => {
  const dt = parseTimestamp('2023-11-16 18:17:04.0319600') - parseTimestamp('2023-11-16 18:17:03.9799600');
  assert.ok(Math.abs(dt - 0.052) < 1e-6, `sub-second differences survive (${dt})`);
  assert.equal(parseTimestamp('12.5'), 12.5);
  assert.ok(Number.isNaN(parseTimestamp('yesterday')));
  const rows = parseTrace([
    'TIMESTAMP,ContextTokens,GeneratedTokens',
    '2023-11-16 18:17:10.0000000,100,0',
    '2023-11-16 18:17:12.0000000,9000,700',
    '2023-11-16 18:17:30.0000000,50,5',
  ].join('\n'));
  assert.deepEqual(rows.map((r) => r.t), [0, 2, 20]);
  const sched = buildSchedule(rows, { models: ['a', 'b'], split: 'replicate', speedup: 2, maxTokens: 512, maxPromptTokens: 4096 });
  assert.equal(sched.length, 6);
  assert.deepEqual(sched.map((e) => e.at), [0, 0, 1, 1, 10, 10]);
  assert.equal(sched[0].maxTokens, 1, 'zero generated tokens are sent as one');
  assert.equal(sched[2].maxTokens, 512);
  assert.equal(sched[2].promptTokens, 4096);
  const sliced = buildSchedule(rows, { models: ['a'], start: 1, length: 5 });
  assert.deepEqual(sliced.map((e) => [e.at, e.traceTokens]), [[0, 700]]);
  const split = buildSchedule(parseTrace(['TIMESTAMP,ContextTokens,GeneratedTokens',
    ...Array.from({ length: 400 }, (_, i) => `${i},10,10`)].join('\n')), { models: ['a', 'b'] });
  const na = split.filter((e) => e.model === 'a').length;
  assert.ok(na > 150 && na < 250, `split spreads requests (${na} of 400 to a)`);
  assert.throws(() => parseTrace('TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,2'), /:2: malformed row/);
  assert.throws(() => parseTrace('a,b,c\n1,2,3'), /header must name/);
});

test('Ctrl-C stops the demo: a report is written and nothing is left running', { timeout: 90000 }, async (t) => {
  const dir = tmpDir('thaw-demo-int-');
  const trace = path.join(dir, 'steady.csv');
  const rows = ['TIMESTAMP,ContextTokens,GeneratedTokens'];
  for (let i = 0; i < 600; i++) rows.push(`${(i * 0.2).toFixed(1)},200,60`);
  fs.writeFileSync(trace, `${rows.join('\n')}\n`);
  const out = path.join(dir, 'out');
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  const child = spawn(process.execPath, [path.join(repoRoot, 'scripts', 'demo.mjs'), '--trace', trace, '--models', '1',
    '--speedup', '1', '--duration', '80', '--out', out, '--cold-start-seconds', '1', '--weights-mb', '8',
    '--polling-interval', '1', '--hpa-sync', '1', ...extraArgs], { cwd: repoRoot, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let text = '';
  child.stdout.on('data', (d) => { text += d; });
  child.stderr.on('data', (d) => { text += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  // Interrupt once requests are flowing (progress lines show requests answered).
  const deadline = Date.now() + 45000;
  while (!/ok=[1-9]/.test(text) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  assert.match(text, /ok=[1-9]/, `requests flowed before the interrupt; output:\n${text}`);
  const tInt = Date.now();
  // As a terminal's Ctrl-C does: SIGINT to the whole process group.
  process.kill(-child.pid, 'SIGINT');
  const killer = setTimeout(() => child.kill('SIGKILL'), 40000);
  const res = await exited;
  clearTimeout(killer);
  for (const line of text.trimEnd().split('\n')) t.diagnostic(line);
  assert.equal(res.code, 130, `exit code after Ctrl-C (signal ${res.signal})`);
  assert.ok(Date.now() - tInt < 30000, 'stopped promptly');
  const report = JSON.parse(fs.readFileSync(path.join(out, 'report.json'), 'utf8'));
  assert.equal(report.endReason, 'interrupted');
  assert.ok(report.totals.requestsSent > 0 && report.totals.succeeded > 0);
  assert.match(text, /interrupted after/);
  const work = path.dirname(report.config.replicaArgs[report.config.replicaArgs.indexOf('--weights-file') + 1]);
  assert.deepEqual(processesUsing(work), [], 'no process of the demo is left');
});
