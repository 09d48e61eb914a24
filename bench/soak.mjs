// Soak: bounded minutes of mixed traffic through thaw-activator, with cold
// starts forced again and again, against sanitizer builds. Started by
// bench/soak.sh (which builds first); `node bench/soak.mjs --help` lists the
// options.
//
// The stack is the demo's (scripts/demo/): redis-server, prometheus, thaw-
// scaler, thaw-activator and the local KEDA/HPA/Deployment stand-in
// (cluster.mjs) running every replica as a thaw-fake-vllm process; requests
// come from the demo's load generator (loadgen.mjs: completions and chat,
// streaming and not, round robin). Three models with different shapes:
//   soak-steady  traffic all the time; every --force-zero-every seconds it is
//                scaled to zero on purpose (out of the endpoints file,
//                drained, stopped) and comes back through the wake path;
//   soak-onoff   45 s on, 45 s off: scaled to zero by KEDA's cooldown while
//                off, a cold start at each "on";
//   soak-bursty  15 s bursts 60 s apart, likewise.
// Every --crash-every seconds a ready replica is killed with SIGKILL (the
// ReplicaSet replaces it): the one kind of failure a client may see, a
// streamed response cut short while that replica served it. (A non-streamed
// request in flight there may also end 502 today: a known activator bug,
// see faults_backend.test.mjs; --allow-crash-502 tolerates exactly those.)
//
// Sampled every --sample-seconds: RSS and open descriptors of thaw-activator
// and thaw-scaler (/proc). At the end, the run fails unless:
//   - every request ended, and none ended badly except streamed responses
//     that were in flight on a model while one of its replicas was killed
//     (counted "expected");
//   - the activator's /metrics account for every request:
//     accepted = sum of outcomes = requests sent, nothing held or in flight,
//     outcomes only ok, plus aborted for the expected cuts;
//   - no sanitizer report (ASan/UBSan/LSan log files or lines in any
//     process's output) and activator and scaler exit 0 on SIGTERM;
//   - over the last half of the run (never before --warmup-seconds: ASan's
//     quarantine and the pools fill first), the RSS slope (least squares) of
//     the activator and of the scaler is below --max-slope-kib-per-min; runs
//     too short for 3 samples there say so and do not judge it.
// A summary is printed; soak-report.json and every process's log go to --out.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { binPath, buildDir, repoRoot, startRedis, tmpDir } from '../test/integration/lib/harness.mjs';
import { Cluster, defaultBehavior } from '../scripts/demo/cluster.mjs';
import { LoadGen } from '../scripts/demo/loadgen.mjs';
import { startActivator, startPrometheus, startScaler } from '../scripts/demo/stack.mjs';
import { mulberry32 } from '../scripts/demo/trace.mjs';

const OPTIONS = {
  minutes: { default: '10', help: 'traffic duration in minutes (setup and the final checks add about a minute)' },
  rate: { default: '20', help: 'mean requests per second over all models' },
  'crash-every': { default: '150', help: 'seconds between replica kills (SIGKILL); 0: none' },
  'force-zero-every': { default: '90', help: 'seconds between forced scale-to-zero of soak-steady; 0: none' },
  'sample-seconds': { default: '10', help: 'RSS sampling period' },
  'max-slope-kib-per-min': { default: '256', help: 'RSS growth allowed over the last half, KiB per minute' },
  'warmup-seconds': { default: '120', help: 'the RSS slope is judged over the last half, but never before this (ASan quarantine, pools filling)' },
  'tokens-per-second': { default: '200', help: 'decode speed of one request on a replica' },
  seed: { default: '7', help: 'seed of the arrival process' },
  'allow-crash-502': { type: 'boolean', default: false, help: 'do not fail on 502s that coincide with a replica kill (a known activator bug: retries reuse dead pooled connections)' },
  out: { default: '', help: 'report directory (default out/soak-<timestamp>)' },
  help: { type: 'boolean', default: false, help: 'show this text' },
};

function usage() {
  const lines = ['usage: bench/soak.sh [--minutes N] [options]   (or: node bench/soak.mjs [options])', '', 'options:'];
  for (const [k, o] of Object.entries(OPTIONS)) {
    lines.push(`  --${k.padEnd(24)}${o.help}${o.type === 'boolean' || o.default === '' ? '' : ` (default: ${o.default})`}`);
  }
  return lines.join('\n');
}

function parseOptions(argv) {
  const spec = Object.fromEntries(Object.entries(OPTIONS).map(([k, o]) => [k, { type: o.type ?? 'string', default: o.default }]));
  const { values } = parseArgs({ args: argv, options: spec, strict: true, allowPositionals: false });
  if (values.help) return { help: true };
  const num = (k, min) => {
    const n = Number(values[k]);
    if (!Number.isFinite(n) || n < min) throw new Error(`--${k}: expected a number >= ${min}, got "${values[k]}"`);
    return n;
  };
  const o = {
    minutes: num('minutes', 0.5),
    rate: num('rate', 0.1),
    crashEvery: num('crash-every', 0),
    forceZeroEvery: num('force-zero-every', 0),
    sampleSeconds: num('sample-seconds', 1),
    maxSlope: num('max-slope-kib-per-min', 0),
    warmupSeconds: num('warmup-seconds', 0),
    tokensPerSecond: num('tokens-per-second', 1),
    seed: num('seed', 0),
    allowCrash502: values['allow-crash-502'],
    out: values.out,
  };
  if (!o.out) o.out = path.join(repoRoot, 'out', `soak-${new Date().toISOString().replace(/[:.]/g, '-').replace(/Z$/, '')}`);
  o.out = path.resolve(o.out);
  return o;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** VmRSS in KiB and open descriptors of pid (NaN when gone). */
function procStats(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return { rss: Number(m[1]), fds: fs.readdirSync(`/proc/${pid}/fd`).length };
  } catch {
    return { rss: NaN, fds: NaN };
  }
}

/** Least-squares slope of [{t (s), v}] in v per minute. */
function slopePerMin(points) {
  const n = points.length;
  if (n < 2) return NaN;
  const mt = points.reduce((a, p) => a + p.t, 0) / n;
  const mv = points.reduce((a, p) => a + p.v, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.t - mt) * (p.v - mv);
    den += (p.t - mt) ** 2;
  }
  return den > 0 ? (num / den) * 60 : NaN;
}

/**
 * Poisson arrivals per model inside its "on" windows. shape: {share,
 * on, off (s; off 0 = always on), phase (s)}. Returns the LoadGen schedule
 * [{seq, at, model, promptTokens, maxTokens}] sorted by time.
 */
function buildSchedule(durationS, rate, shapes, seed) {
  const rand = mulberry32(seed);
  const out = [];
  for (const [model, s] of Object.entries(shapes)) {
    const dutyCycle = s.off ? s.on / (s.on + s.off) : 1;
    const lambda = (rate * s.share) / dutyCycle;   // while on
    let t = 0;
    for (;;) {
      t += -Math.log(1 - rand()) / lambda;
      if (t >= durationS) break;
      if (s.off) {
        const x = (t + s.phase) % (s.on + s.off);
        if (x >= s.on) continue;
      }
      out.push({
        at: t, model,
        promptTokens: 16 + Math.floor(rand() * 500),
        maxTokens: 4 + Math.floor(rand() * 60),
      });
    }
  }
  out.sort((a, b) => a.at - b.at);
  out.forEach((e, i) => { e.seq = i; });
  return out;
}

const SHAPES = {
  'soak-steady': { share: 0.5, on: 0, off: 0, phase: 0 },
  'soak-onoff': { share: 0.3, on: 45, off: 45, phase: 0 },
  'soak-bursty': { share: 0.2, on: 15, off: 60, phase: 40 },
};

/** Sanitizer findings in a process's captured output. */
const SANITIZER_RE = /AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|SUMMARY: \w+Sanitizer/;

async function main() {
  let opt;
  try {
    opt = parseOptions(process.argv.slice(2));
  } catch (e) {
    console.error(`soak: ${e.message}\n\n${usage()}`);
    return 2;
  }
  if (opt.help) {
    console.log(usage());
    return 0;
  }
  for (const bin of ['thaw-scaler', 'thaw-activator', 'thaw-fake-vllm']) {
    if (!fs.existsSync(binPath(bin))) throw new Error(`${binPath(bin)} not found: build first (bench/soak.sh does)`);
  }
  const durationS = opt.minutes * 60;
  const models = Object.keys(SHAPES);
  const schedule = buildSchedule(durationS, opt.rate, SHAPES, opt.seed);
  const logsDir = path.join(opt.out, 'logs');
  fs.mkdirSync(logsDir, { recursive: true });
  const sanDir = process.env.THAW_SOAK_SANITIZER_DIR ?? '';
  const work = tmpDir('thaw-soak-');
  const endpointsDir = path.join(work, 'endpoints');
  fs.mkdirSync(endpointsDir);
  const eventLog = fs.createWriteStream(path.join(logsDir, 'soak-events.log'));
  const note = (s) => eventLog.write(`${new Date().toISOString()} ${s}\n`);
  const say = (s) => { console.log(s); note(s); };

  say(`soak: ${opt.minutes} min, ${schedule.length} requests (${opt.rate} req/s) over ${models.join(', ')}; ` +
    `build ${path.relative(repoRoot, buildDir) || buildDir}; out ${path.relative(process.cwd(), opt.out) || opt.out}`);

  const stopList = [];
  const procs = {};
  let cluster = null;
  let loadgen = null;
  const failures = [];
  const crashes = [];      // {t, model, pod}
  const forced = [];       // {t, model}
  const samples = [];      // {t, activator: {rss, fds}, scaler: {rss, fds}, ...}
  const report = { options: opt, build: buildDir };
  let exitCode = 1;
  let interrupted = false;
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.removeAllListeners(sig);
    process.on(sig, () => { if (interrupted) process.exit(130); interrupted = true; });
  }

  try {
    fs.mkdirSync(path.join(work, 'redis'));
    const redis = await startRedis({ dir: path.join(work, 'redis') });
    stopList.push(['redis-server', () => redis.stop()]);
    const prom = await startPrometheus({ dir: path.join(work, 'prometheus') });
    stopList.push(['prometheus', () => prom.stop()]);
    const scaler = await startScaler({
      redisUrl: redis.url, prometheusUrl: prom.url,
      flags: {
        'token-rate-query': 'sum by (model_name) (rate(vllm:generation_tokens_total[10s]))',
        'prometheus-interval-ms': 1000, 'redis-interval-ms': 500,
        'scale-down-stabilization-seconds': 5, 'bursty-scale-down-stabilization-seconds': 5,
        'held-fresh-seconds': 5,
      },
    });
    procs.scaler = scaler.proc;
    stopList.push(['thaw-scaler', () => scaler.stop()]);
    const activator = await startActivator({
      dir: work, redisUrl: redis.url, scalerWakeUrl: scaler.httpBase,
      models: models.map((name) => ({ name, endpointsFile: path.join(endpointsDir, `${name}.endpoints`) })),
      // maxConcurrencyPerEndpoint = the fake replicas' --max-batch, and late
      // requests last after 1.5 s, as recommended.
      modelDefaults: {
        holdTimeoutSeconds: 120, maxHeldRequests: 100000, probeInitialMs: 20, probeMaxMs: 200,
        maxConcurrencyPerEndpoint: 16, lateAfterSeconds: 1.5,
      },
    });
    procs.activator = activator.proc;
    stopList.push(['thaw-activator', () => activator.stop()]);
    const staticTargets = [
      { address: `127.0.0.1:${scaler.httpPort}`, labels: { component: 'thaw-scaler' } },
      { address: `127.0.0.1:${activator.adminPort}`, labels: { component: 'thaw-activator' } },
    ];
    prom.setTargets(staticTargets);
    say(`  redis ${redis.url}, prometheus ${prom.url}, scaler ${scaler.grpcAddress} (pid ${scaler.proc.pid}), ` +
      `activator ${activator.base} (pid ${activator.proc.pid})`);

    cluster = new Cluster({
      scalerAddress: scaler.grpcAddress,
      models,
      // coldStartSeconds: the replicas' 1.5 s load plus one KEDA poll;
      // replicaConcurrency: their --max-batch. lateAfterSeconds is the
      // activator's, published with its queue. Every request goes through the
      // activator: it says when a model is idle (idleSignal).
      metadata: {
        targetTokensPerSecond: 600, targetQueueLength: 10, coldStartSeconds: 4, replicaConcurrency: 16,
        idleSignal: 'activators',
      },
      pollingIntervalMs: 2000, cooldownMs: 10000, maxReplicaCount: 3, hpaSyncMs: 2000,
      behavior: defaultBehavior(2000),
      replica: {
        bin: binPath('thaw-fake-vllm'),
        args: ['--load-delay-ms', '1500', '--tokens-per-second', String(opt.tokensPerSecond),
          '--max-batch', '16', '--ttft-ms', '20'],
        readinessPeriodMs: 250, terminationGraceMs: 20000, drainMinMs: 1000,
      },
      endpointsDir,
      onScrapeTargets: (list) => prom.setTargets([...staticTargets, ...list]),
      log: note,
    });
    const scaleEvents = [];
    cluster.on('scale', (e) => scaleEvents.push(e));
    cluster.on('pod', (e) => note(`pod ${e.pod} ${e.state}${e.coldStartMs ? ` cold_start_ms=${e.coldStartMs}` : ''}`));
    cluster.start();
    await sleep(2500);

    loadgen = new LoadGen({ schedule, models, target: { host: '127.0.0.1', port: activator.port }, requestTimeoutMs: 180000 });
    const t0 = Date.now();
    loadgen.start(t0);
    const elapsed = () => (Date.now() - t0) / 1000;

    // Fault injection timers.
    const timers = [];
    if (opt.crashEvery > 0) {
      let n = 0;
      timers.push(setInterval(() => {
        // Alternate over the models that have a ready replica now.
        const ready = cluster.pods().filter((p) => p.state === 'ready');
        if (!ready.length) return;
        const victim = ready[n++ % ready.length];
        const m = cluster.models.get(victim.model);
        const pod = m.pods.find((p) => p.id === victim.id);
        if (!pod?.proc) return;
        crashes.push({ t: Date.now(), model: victim.model, pod: victim.id, pid: pod.proc.pid });
        note(`crash: SIGKILL ${victim.id} (pid ${pod.proc.pid})`);
        pod.proc.proc.kill('SIGKILL');
      }, opt.crashEvery * 1000));
    }
    if (opt.forceZeroEvery > 0) {
      timers.push(setInterval(() => {
        const m = cluster.models.get('soak-steady');
        if (m.replicas === 0) return;
        forced.push({ t: Date.now(), model: m.name });
        note('forced scale to zero: soak-steady');
        cluster.setReplicas(m, 0, 'soak', 'forced');
      }, opt.forceZeroEvery * 1000));
    }

    // Sampling until the schedule is sent and every request has ended.
    let nextSample = 0;
    for (;;) {
      if (interrupted) throw new Error('interrupted');
      const t = elapsed();
      if (t >= nextSample) {
        nextSample += opt.sampleSeconds;
        const a = procStats(activator.proc.pid);
        const s = procStats(scaler.proc.pid);
        let totals = { sent: 0, ok: 0, failed: 0, lost: 0, inflight: 0, held: 0 };
        for (const name of models) {
          const c = loadgen.counters[name];
          totals = { sent: totals.sent + c.sent, ok: totals.ok + c.ok, failed: totals.failed + c.failed,
            lost: totals.lost + c.lost, inflight: totals.inflight + c.inflight, held: totals.held + c.held };
        }
        const pods = cluster.pods().filter((p) => p.state === 'ready' || p.state === 'starting').length;
        samples.push({ t, activator: a, scaler: s, ...totals, pods });
        console.log(`  t=${t.toFixed(0).padStart(4)} s  activator ${String(a.rss).padStart(6)} KiB ${String(a.fds).padStart(4)} fds  ` +
          `scaler ${String(s.rss).padStart(6)} KiB ${String(s.fds).padStart(3)} fds  sent ${totals.sent} ok ${totals.ok} ` +
          `failed ${totals.failed} lost ${totals.lost} inflight ${totals.inflight} held ${totals.held} replicas ${pods}`);
      }
      if (loadgen.doneSending() && loadgen.inflight.size === 0) break;
      if (t > durationS + 150) {
        failures.push(`${loadgen.inflight.size} requests still in flight 150 s after the last was sent`);
        loadgen.abortAll('soak_end');
        break;
      }
      await sleep(250);
    }
    for (const tm of timers) clearInterval(tm);
    const trafficEnd = elapsed();

    // Client side: what ended how, and which failures were expected.
    const byOutcome = {};
    const unexpected = [];
    let expectedCuts = 0;
    let crash502 = 0;
    const crashDuring = (r, from) => crashes.some((c) => c.model === r.model && c.t >= from - 50 && c.t <= r.doneMs + 50);
    for (const r of loadgen.records) {
      byOutcome[r.outcome] = (byOutcome[r.outcome] ?? 0) + 1;
      if (r.outcome === 'ok') continue;
      if (r.outcome === 'truncated' && r.stream && r.status === 200 && crashDuring(r, r.headersMs)) {
        expectedCuts++;
      } else if (r.status === 502 && crashDuring(r, r.sentMs)) {
        // Known bug: the request in flight on a killed replica is resent on
        // other pooled connections to it (see faults_backend.test.mjs).
        crash502++;
        if (!opt.allowCrash502) unexpected.push(r);
      } else {
        unexpected.push(r);
      }
    }
    if (unexpected.length) {
      const why = crash502 && !opt.allowCrash502 ? ` (${crash502} of them 502s at replica kills: the known bug, --allow-crash-502 tolerates them)` : '';
      failures.push(`${unexpected.length} requests ended badly${why}: ` +
        JSON.stringify(unexpected.slice(0, 5).map((r) => ({ seq: r.seq, model: r.model, stream: r.stream, status: r.status, outcome: r.outcome, error: r.error }))));
    }
    const heldServed = loadgen.records.filter((r) => r.held && r.outcome === 'ok').length;

    // The activator's side: accepted = answered = sent.
    const metrics = async () => {
      const res = await fetch(`${activator.adminBase}/metrics`);
      const text = await res.text();
      const out = { accepted: 0, ended: 0, held: 0, inflight: 0, outcomes: {}, coldStarts: 0, lateReleased: 0 };
      for (const line of text.split('\n')) {
        const m = /^(thaw_activator_[a-z_]+)(\{[^}]*\})? (\S+)$/.exec(line);
        if (!m) continue;
        const v = Number(m[3]);
        if (m[1] === 'thaw_activator_requests_accepted_total') out.accepted += v;
        if (m[1] === 'thaw_activator_requests_total') {
          out.ended += v;
          const o = /outcome="([^"]+)"/.exec(m[2])[1];
          if (v) out.outcomes[o] = (out.outcomes[o] ?? 0) + v;
        }
        if (m[1] === 'thaw_activator_held_requests') out.held += v;
        if (m[1] === 'thaw_activator_inflight_requests') out.inflight += v;
        if (m[1] === 'thaw_activator_cold_starts_total') out.coldStarts += v;
        if (m[1] === 'thaw_activator_late_released_total') out.lateReleased += v;
      }
      return out;
    };
    let am = await metrics();
    for (let i = 0; i < 20 && (am.accepted !== am.ended || am.held || am.inflight); i++) {
      await sleep(250);
      am = await metrics();
    }
    if (am.accepted !== am.ended || am.held !== 0 || am.inflight !== 0) {
      failures.push(`activator: accepted ${am.accepted} != sum of outcomes ${am.ended} (held ${am.held}, in flight ${am.inflight})`);
    }
    if (am.accepted !== loadgen.records.length) {
      failures.push(`activator accepted ${am.accepted} requests, the load generator sent ${loadgen.records.length}`);
    }
    const allowed = new Set(['ok', 'aborted', ...(opt.allowCrash502 ? ['bad_gateway'] : [])]);
    const odd = Object.keys(am.outcomes).filter((o) => !allowed.has(o));
    if (odd.length) failures.push(`activator outcomes other than ${[...allowed].join('/')}: ${JSON.stringify(am.outcomes)}`);
    if (opt.allowCrash502 && (am.outcomes.bad_gateway ?? 0) !== crash502) {
      failures.push(`activator counted ${am.outcomes.bad_gateway ?? 0} bad_gateway, clients saw ${crash502} 502s at replica kills`);
    }
    if ((am.outcomes.aborted ?? 0) !== expectedCuts) {
      failures.push(`activator counted ${am.outcomes.aborted ?? 0} aborted responses, clients saw ${expectedCuts} expected cuts`);
    }

    // RSS over the last half of the traffic, after the warm-up.
    const windowStart = Math.max(trafficEnd / 2, opt.warmupSeconds);
    const half = samples.filter((x) => x.t >= windowStart);
    const judged = half.length >= 3;
    if (!judged) {
      say(`WARNING: RSS slope not judged: fewer than 3 samples after ${windowStart.toFixed(0)} s ` +
        '(run at least twice --warmup-seconds)');
    }
    const rssSummary = {};
    for (const who of ['activator', 'scaler']) {
      const pts = half.map((x) => ({ t: x.t, v: x[who].rss })).filter((p) => Number.isFinite(p.v));
      const all = samples.map((x) => x[who].rss).filter(Number.isFinite);
      const fds = samples.map((x) => x[who].fds).filter(Number.isFinite);
      rssSummary[who] = {
        firstKiB: all[0], lastKiB: all.at(-1), maxKiB: Math.max(...all),
        lastHalfFirstKiB: pts[0]?.v, lastHalfLastKiB: pts.at(-1)?.v,
        slopeKiBPerMin: slopePerMin(pts),
        fdsFirst: fds[0], fdsLast: fds.at(-1), fdsMax: Math.max(...fds),
      };
      rssSummary[who].windowStartS = windowStart;
      rssSummary[who].judged = judged;
      if (judged && !(rssSummary[who].slopeKiBPerMin <= opt.maxSlope)) {
        failures.push(`${who}: RSS slope over the last half ${rssSummary[who].slopeKiBPerMin.toFixed(1)} KiB/min > ${opt.maxSlope}`);
      }
    }

    report.traffic = {
      seconds: trafficEnd, requests: loadgen.records.length, outcomes: byOutcome, expectedCuts, crash502,
      unexpected: unexpected.length, heldServed,
      streaming: loadgen.records.filter((r) => r.stream).length,
      tokens: loadgen.records.reduce((a, r) => a + (r.tokens || 0), 0),
    };
    report.faults = {
      crashes: crashes.length, forcedScaleToZero: forced.length,
      scaleFromZero: scaleEvents.filter((e) => e.from === 0 && e.to > 0).length,
      scaleToZero: scaleEvents.filter((e) => e.to === 0).length,
      replicaStarts: cluster.pods().length,
    };
    report.activator = am;
    report.rss = rssSummary;
    report.samples = samples;

    // Shut down in order; sanitizers report at exit.
    await cluster.stop();
    for (const [name, stop] of [...stopList].reverse()) {
      try {
        const code = await stop();
        if ((name === 'thaw-activator' || name === 'thaw-scaler') && code !== 0) failures.push(`${name} exited ${code} on SIGTERM`);
      } catch (e) {
        failures.push(`${name}: ${e.message.split('\n')[0]}`);
      }
    }
    stopList.length = 0;
    const crashedPids = new Set(crashes.map((c) => c.pid));
    const logged = [['thaw-activator', procs.activator], ['thaw-scaler', procs.scaler],
      ...cluster.procs.map((p) => [p.name, p])];
    const sanitizer = [];
    for (const [name, p] of logged) {
      fs.writeFileSync(path.join(logsDir, `${name}-${p.pid}.log`), `${p.output()}\n`);
      if (SANITIZER_RE.test(p.output())) sanitizer.push(`${name} (pid ${p.pid}): output`);
      if (p.name.startsWith('soak-') && !crashedPids.has(p.pid) && p.exitCode !== 0) {
        failures.push(`replica ${p.name} exited ${p.exitCode}`);
      }
    }
    if (sanDir && fs.existsSync(sanDir)) {
      for (const f of fs.readdirSync(sanDir)) {
        const text = fs.readFileSync(path.join(sanDir, f), 'utf8');
        if (text.trim()) {
          sanitizer.push(`${f}: ${text.split('\n').find((l) => SANITIZER_RE.test(l)) ?? text.split('\n')[0]}`);
          fs.copyFileSync(path.join(sanDir, f), path.join(logsDir, f));
        }
      }
    }
    if (sanitizer.length) failures.push(`sanitizer reports: ${sanitizer.join('; ')}`);
    report.sanitizerReports = sanitizer;
    report.processes = logged.length;

    // Summary.
    const tr = report.traffic;
    const f = report.faults;
    console.log('');
    console.log(`traffic   ${tr.requests} requests in ${tr.seconds.toFixed(0)} s (${tr.streaming} streaming), ${tr.tokens} tokens; ` +
      `outcomes ${JSON.stringify(tr.outcomes)}; expected cuts ${tr.expectedCuts}, 502s at replica kills ${tr.crash502}` +
      `${opt.allowCrash502 ? ' (known bug, allowed)' : ''}, unexpected ${tr.unexpected}; ${tr.heldServed} held and served`);
    console.log(`faults    ${f.crashes} replica kills, ${f.forcedScaleToZero} forced scale-to-zero, ${f.scaleToZero} scale-to-zero in all, ` +
      `${f.scaleFromZero} scale-from-zero, ${f.replicaStarts} replica starts; activator cold starts ${am.coldStarts}, ` +
      `requests sent late (behind newer ones) ${am.lateReleased}`);
    console.log(`activator accepted ${am.accepted} = outcomes ${am.ended} ${JSON.stringify(am.outcomes)}`);
    for (const who of ['activator', 'scaler']) {
      const r = rssSummary[who];
      console.log(`rss       ${who.padEnd(9)} first ${r.firstKiB} KiB, max ${r.maxKiB}, last ${r.lastKiB}; from ${r.windowStartS.toFixed(0)} s ${r.lastHalfFirstKiB ?? "-"} -> ` +
        `${r.lastHalfLastKiB ?? "-"} KiB, slope ${r.judged ? `${r.slopeKiBPerMin.toFixed(1)} KiB/min (limit ${opt.maxSlope})` : 'not judged (too short)'}; ` +
        `fds ${r.fdsFirst} -> ${r.fdsLast} (max ${r.fdsMax})`);
    }
    console.log(`sanitizer ${sanitizer.length ? sanitizer.join('; ') : 'no reports'} (${report.processes} processes)`);
    exitCode = failures.length ? 1 : 0;
  } catch (e) {
    failures.push(e.stack ?? String(e));
  } finally {
    loadgen?.stopSending();
    loadgen?.abortAll('soak_stopped');
    loadgen?.close();
    if (cluster && !cluster.stopped) await cluster.stop().catch(() => {});
    for (const [, stop] of [...stopList].reverse()) {
      try { await stop(); } catch { /* already failing */ }
    }
    report.failures = failures;
    report.ok = failures.length === 0;
    fs.writeFileSync(path.join(opt.out, 'soak-report.json'), `${JSON.stringify(report, null, 1)}\n`);
    eventLog.end();
  }
  if (failures.length) {
    console.log(`\nSOAK FAILED:\n  - ${failures.join('\n  - ')}`);
    exitCode = 1;
  } else {
    console.log('\nsoak passed');
  }
  return exitCode;
}

main().then((code) => {
  process.exitCode = code;
  setTimeout(() => process.exit(code), 200).unref();
}, (e) => {
  console.error(e);
  process.exit(1);
});
