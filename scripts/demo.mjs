// Thaw's main job on one machine: a local serverless-inference stack that
// replays a real request trace. Started by scripts/demo.sh (which installs
// and builds first); `node scripts/demo.mjs --help` lists the options.
//
// On free loopback ports: redis-server, prometheus (scraping everything every
// second), thaw-scaler, thaw-activator, and a local cluster (scripts/demo/
// cluster.mjs) playing KEDA + HPA + the Deployment controller over real gRPC,
// with every replica a thaw-fake-vllm process that loads weights from a file.
// A load generator replays the trace through the activator; a live view
// shows what happens; report.json, timeline.svg and the logs land in --out.
// Exit status 0 only if no request was lost or failed.

import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { binPath, buildDir, repoRoot, startRedis, tmpDir } from '../test/integration/lib/harness.mjs';
import { Cluster, defaultBehavior } from './demo/cluster.mjs';
import { DirectRouter, LoadGen } from './demo/loadgen.mjs';
import { buildReport, summaryText, timelineSvg } from './demo/report.mjs';
import { activatorAvailable, scalerFlags, startActivator, startPrometheus, startScaler } from './demo/stack.mjs';
import { buildSchedule, loadTrace } from './demo/trace.mjs';
import { clearScreen, drawTty, hideCursor, progressLine, showCursor } from './demo/view.mjs';

const MODEL_NAMES = ['llama-8b', 'mistral-7b', 'qwen-14b', 'gemma-9b', 'phi-4', 'granite-8b'];

const OPTIONS = {
  trace: { type: 'string', default: path.join(repoRoot, 'demo', 'traces', 'azure_code_slice.csv'), help: 'Azure-format CSV: TIMESTAMP,ContextTokens,GeneratedTokens' },
  'trace-start': { type: 'string', default: '0', help: 'trace seconds to skip' },
  'trace-length': { type: 'string', default: '0', help: 'trace seconds to replay (0: to the end)' },
  models: { type: 'string', default: '2', help: 'number of models the trace is spread over' },
  split: { type: 'string', default: 'split', help: '"split": each request to one model; "replicate": to every model' },
  speedup: { type: 'string', default: '4', help: 'time compression of the trace' },
  duration: { type: 'string', default: '300', help: 'hard bound on the whole run, seconds' },
  out: { type: 'string', default: '', help: 'report directory (default out/demo-<timestamp>)' },
  'cold-start-seconds': { type: 'string', default: '4', help: 'replica start to ready: weights read from a file plus a fixed delay' },
  'weights-mb': { type: 'string', default: '64', help: 'size of the fake weights file each replica reads' },
  'tokens-per-second': { type: 'string', default: '60', help: 'decode speed of one request on a replica' },
  'max-batch': { type: 'string', default: '8', help: 'requests a replica decodes at once (more wait in its queue)' },
  'target-tokens-per-second': { type: 'string', default: '300', help: 'ScaledObject targetTokensPerSecond (per replica)' },
  'max-replicas': { type: 'string', default: '6', help: 'ScaledObject maxReplicaCount' },
  'polling-interval': { type: 'string', default: '2', help: 'KEDA pollingInterval, seconds' },
  cooldown: { type: 'string', default: '15', help: 'KEDA cooldownPeriod, seconds' },
  'hpa-sync': { type: 'string', default: '2', help: 'HPA sync period (and rate-limit period), seconds' },
  'scaler-stabilization': { type: 'string', default: '10', help: 'thaw-scaler --scale-down-stabilization-seconds and --bursty-scale-down-stabilization-seconds' },
  'rate-window': { type: 'string', default: '10s', help: 'range of rate() in the token-rate query' },
  'max-tokens': { type: 'string', default: '512', help: 'cap on max_tokens (the trace\'s GeneratedTokens)' },
  'max-prompt-tokens': { type: 'string', default: '4096', help: 'cap on the prompt size (the trace\'s ContextTokens)' },
  'tail-seconds': { type: 'string', default: '10', help: 'no new request in the last seconds of --duration' },
  seed: { type: 'string', default: '1', help: 'seed for spreading requests over models' },
  'scaler-flag': { type: 'string', multiple: true, default: [], help: 'extra thaw-scaler flag NAME=VALUE (repeatable), e.g. log-level=debug' },
  'trigger-metadata': { type: 'string', multiple: true, default: [], help: 'extra ScaledObject trigger metadata KEY=VALUE (repeatable)' },
  'no-activator': { type: 'boolean', default: false, help: 'route requests to replicas from the load generator (a stand-in; not Thaw\'s activator)' },
  quiet: { type: 'boolean', default: false, help: 'no live view or progress lines, only the summary' },
  help: { type: 'boolean', default: false, help: 'show this text' },
};

function usage() {
  const lines = ['usage: scripts/demo.sh [options]   (or: node scripts/demo.mjs [options])', '',
    'Replays an LLM request trace through thaw-activator while a local KEDA/HPA stand-in', 'scales fake vLLM replicas from zero with thaw-scaler\'s decisions.', '', 'options:'];
  for (const [k, o] of Object.entries(OPTIONS)) {
    const def = o.type === 'boolean' || o.multiple || o.default === '' ? '' : ` (default: ${k === 'trace' ? shown(o.default) : o.default})`;
    lines.push(`  --${k.padEnd(26)}${o.help}${def}`);
  }
  return lines.join('\n');
}

/** A path as the user would type it: relative below the cwd, else absolute. */
function shown(p) {
  const r = path.relative(process.cwd(), p);
  return r && !r.startsWith('..') ? r : p;
}

function numberOpt(v, name, { min = -Infinity, integer = false } = {}) {
  const n = Number(v);
  if (!Number.isFinite(n) || n < min || (integer && !Number.isInteger(n))) {
    throw new Error(`--${name}: expected ${integer ? 'an integer' : 'a number'} >= ${min}, got "${v}"`);
  }
  return n;
}

/**
 * thaw-scaler flags that tell its policy the demo's time scale, for the
 * policy knobs this scaler has flags for: the demo compresses time (a 4 s
 * cold start instead of minutes), and defaults tuned for real cold starts
 * would hold replicas for minutes of demo time. Each knob is
 * [[flag names, first supported wins], value in seconds]; "-ms" flags get ms.
 */
function timescaleFlags(opt, supported) {
  const rateWindow = Number.parseFloat(opt.rateWindow) * ({ ms: 0.001, s: 1, m: 60 }[opt.rateWindow.replace(/^[\d.]+/, '')] ?? 1);
  const coldStart = opt.coldStartSeconds + Math.max(1, opt.pollingInterval);
  const knobs = [
    [['cold-start-seconds', 'cold-start-ms'], coldStart],
    [['rate-window-seconds', 'rate-window-ms'], rateWindow],
    [['trend-window-seconds', 'trend-window-ms'], 2 * rateWindow],
    [['surge-hold-seconds', 'surge-hold-ms'], coldStart],
    [['keep-warm-max-seconds', 'keep-warm-max-ms'], 30 * coldStart],
  ];
  const out = {};
  for (const [names, seconds] of knobs) {
    const name = names.find((n) => supported.has(n));
    if (name) out[name] = name.endsWith('-ms') ? String(Math.round(seconds * 1000)) : String(seconds);
  }
  return out;
}

/** ["k=v", ...] to {k: v}. */
function pairs(list, name) {
  const out = {};
  for (const item of list) {
    const i = item.indexOf('=');
    if (i <= 0) throw new Error(`--${name}: expected NAME=VALUE, got "${item}"`);
    out[item.slice(0, i).replace(/^--/, '')] = item.slice(i + 1);
  }
  return out;
}

function parseOptions(argv) {
  const spec = Object.fromEntries(Object.entries(OPTIONS).map(([k, o]) => [k, { type: o.type, default: o.default, multiple: Boolean(o.multiple) }]));
  const { values } = parseArgs({ args: argv, options: spec, strict: true, allowPositionals: false });
  if (values.help) return { help: true };
  const o = {
    trace: path.resolve(values.trace),
    traceStart: numberOpt(values['trace-start'], 'trace-start', { min: 0 }),
    traceLength: numberOpt(values['trace-length'], 'trace-length', { min: 0 }),
    models: numberOpt(values.models, 'models', { min: 1, integer: true }),
    split: values.split,
    speedup: numberOpt(values.speedup, 'speedup', { min: 0.01 }),
    duration: numberOpt(values.duration, 'duration', { min: 10 }),
    coldStartSeconds: numberOpt(values['cold-start-seconds'], 'cold-start-seconds', { min: 0 }),
    weightsMb: numberOpt(values['weights-mb'], 'weights-mb', { min: 1, integer: true }),
    tokensPerSecond: numberOpt(values['tokens-per-second'], 'tokens-per-second', { min: 1 }),
    maxBatch: numberOpt(values['max-batch'], 'max-batch', { min: 1, integer: true }),
    targetTokensPerSecond: numberOpt(values['target-tokens-per-second'], 'target-tokens-per-second', { min: 1 }),
    maxReplicas: numberOpt(values['max-replicas'], 'max-replicas', { min: 1, integer: true }),
    pollingInterval: numberOpt(values['polling-interval'], 'polling-interval', { min: 0.1 }),
    cooldown: numberOpt(values.cooldown, 'cooldown', { min: 0 }),
    hpaSync: numberOpt(values['hpa-sync'], 'hpa-sync', { min: 0.1 }),
    scalerStabilization: numberOpt(values['scaler-stabilization'], 'scaler-stabilization', { min: 0 }),
    rateWindow: values['rate-window'],
    maxTokens: numberOpt(values['max-tokens'], 'max-tokens', { min: 0, integer: true }),
    maxPromptTokens: numberOpt(values['max-prompt-tokens'], 'max-prompt-tokens', { min: 0, integer: true }),
    tailSeconds: numberOpt(values['tail-seconds'], 'tail-seconds', { min: 0 }),
    seed: numberOpt(values.seed, 'seed', { integer: true }),
    scalerFlags: pairs(values['scaler-flag'], 'scaler-flag'),
    triggerMetadata: pairs(values['trigger-metadata'], 'trigger-metadata'),
    noActivator: values['no-activator'],
    quiet: values.quiet,
    out: values.out,
  };
  if (!['split', 'replicate'].includes(o.split)) throw new Error(`--split: expected "split" or "replicate", got "${o.split}"`);
  if (!/^\d+(ms|s|m)$/.test(o.rateWindow)) throw new Error(`--rate-window: expected a PromQL duration like 10s, got "${o.rateWindow}"`);
  if (!o.out) {
    const stamp = new Date().toISOString().replace(/[:.]/g, '-').replace(/Z$/, '');
    o.out = path.join(repoRoot, 'out', `demo-${stamp}`);
  }
  o.out = path.resolve(o.out);
  return o;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function getJson(url, timeoutMs = 800) {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
    if (res.status !== 200) { await res.arrayBuffer(); return null; }
    return await res.json();
  } catch {
    return null;
  }
}

async function main() {
  const startMs = Date.now();
  let opt;
  try {
    opt = parseOptions(process.argv.slice(2));
  } catch (e) {
    console.error(`demo: ${e.message}\n\n${usage()}`);
    return 2;
  }
  if (opt.help) {
    console.log(usage());
    return 0;
  }
  const tty = process.stdout.isTTY && !opt.quiet;
  const say = (s) => { if (!opt.quiet) console.log(s); };
  const models = Array.from({ length: opt.models }, (_, i) => MODEL_NAMES[i] ?? `model-${i + 1}`);

  // Ctrl-C: stop the run, still write the report, stop everything. A second
  // one gives up at once (the harness's exit hook kills what is left).
  let interrupted = false;
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.removeAllListeners(sig);
    process.on(sig, () => {
      if (interrupted) {
        if (tty) showCursor();
        process.exit(130);
      }
      interrupted = sig;
    });
  }

  const rows = loadTrace(opt.trace);
  const fullSchedule = buildSchedule(rows, {
    models, split: opt.split, start: opt.traceStart, length: opt.traceLength, speedup: opt.speedup,
    maxTokens: opt.maxTokens, maxPromptTokens: opt.maxPromptTokens, seed: opt.seed,
  });
  if (!fullSchedule.length) throw new Error(`${opt.trace}: no request in the chosen slice`);

  for (const bin of ['thaw-scaler', 'thaw-fake-vllm']) {
    if (!fs.existsSync(binPath(bin))) throw new Error(`${binPath(bin)} not found: build first (meson compile -C ${buildDir})`);
  }
  let mode = 'through thaw-activator';
  if (opt.noActivator) {
    mode = 'no activator (load generator routes to replicas)';
  } else {
    const a = await activatorAvailable();
    if (!a.ok) throw new Error(`thaw-activator is not usable: ${a.why}. Run with --no-activator to route requests directly to the replicas.`);
  }

  fs.mkdirSync(path.join(opt.out, 'logs'), { recursive: true });
  const work = tmpDir('thaw-demo-');
  const endpointsDir = path.join(work, 'endpoints');
  fs.mkdirSync(endpointsDir);
  say(`Thaw local demo: ${fullSchedule.length} requests from ${shown(opt.trace)}, ${opt.models} model(s), speedup ×${opt.speedup}, at most ${opt.duration} s`);

  // Weights every replica reads at start: a real file, read at a rate that
  // makes the load take ~80 % of the cold start; the rest is a fixed delay.
  const weightsFile = path.join(work, 'weights.bin');
  {
    const chunk = Buffer.alloc(1 << 20);
    for (let i = 0; i < chunk.length; i += 4) chunk.writeUInt32LE((i * 2654435761) >>> 0, i);
    const fd = fs.openSync(weightsFile, 'w');
    for (let i = 0; i < opt.weightsMb; i++) fs.writeSync(fd, chunk);
    fs.closeSync(fd);
  }
  const readSeconds = opt.coldStartSeconds * 0.8;
  const weightsBytes = opt.weightsMb * 1048576;
  const replicaArgs = [
    '--weights-file', weightsFile,
    '--weights-read-mbps', readSeconds > 0 ? (weightsBytes / 1e6 / readSeconds).toFixed(3) : '0',
    '--load-delay-ms', String(Math.round(opt.coldStartSeconds * 200)),
    '--tokens-per-second', String(opt.tokensPerSecond),
    '--max-batch', String(opt.maxBatch),
    '--max-tokens-default', '16',
  ];

  const stopList = []; // [name, stop()] in start order; stopped in reverse
  const handles = {};
  let cluster = null;
  let loadgen = null;
  let router = null;
  let report = null;
  let exitCode = 1;
  let endReason = null;
  const recent = [];
  const note = (s) => {
    const line = `${new Date().toISOString().slice(11, 19)} ${s}`;
    recent.push(line);
    if (recent.length > 200) recent.shift();
  };
  const stackLog = fs.createWriteStream(path.join(opt.out, 'logs', 'demo-events.log'));

  try {
    fs.mkdirSync(path.join(work, 'redis'));
    const redis = await startRedis({ dir: path.join(work, 'redis') });
    handles.redis = redis;
    stopList.push(['redis-server', () => redis.stop()]);
    say(`  redis-server     ${redis.url}`);
    const prom = await startPrometheus({ dir: path.join(work, 'prometheus') });
    handles.prom = prom;
    stopList.push(['prometheus', () => prom.stop()]);
    say(`  prometheus       ${prom.url} (scrapes every 1 s)`);
    const scalerFlagsUsed = {
      'token-rate-query': `sum by (model_name) (rate(vllm:generation_tokens_total[${opt.rateWindow}]))`,
      'prometheus-interval-ms': 1000,
      'redis-interval-ms': 500,
      'scale-down-stabilization-seconds': opt.scalerStabilization,
      'bursty-scale-down-stabilization-seconds': opt.scalerStabilization,
      ...timescaleFlags(opt, await scalerFlags()),
      ...opt.scalerFlags,
    };
    handles.scalerFlags = scalerFlagsUsed;
    const scaler = await startScaler({ redisUrl: redis.url, prometheusUrl: prom.url, flags: scalerFlagsUsed });
    handles.scaler = scaler;
    stopList.push(['thaw-scaler', () => scaler.stop()]);
    say(`  thaw-scaler      gRPC ${scaler.grpcAddress}, ${scaler.httpBase}/models`);
    const staticTargets = [{ address: `127.0.0.1:${scaler.httpPort}`, labels: { component: 'thaw-scaler' } },
      { address: `127.0.0.1:${prom.port}`, labels: { component: 'prometheus' } }];

    let activator = null;
    if (!opt.noActivator) {
      activator = await startActivator({
        dir: work, redisUrl: redis.url, scalerWakeUrl: scaler.httpBase,
        models: models.map((name) => ({ name, endpointsFile: path.join(endpointsDir, `${name}.endpoints`) })),
        // The cap is the replicas' batch, as docs/activator.md recommends: requests over it
        // wait in the activator, where thaw-scaler sees them as queued; those waiting
        // over 1.5 s go behind newer ones (lateAfterSeconds, as the example config).
        modelDefaults: {
          holdTimeoutSeconds: Math.max(60, opt.duration), maxHeldRequests: 100000,
          maxConcurrencyPerEndpoint: opt.maxBatch, lateAfterSeconds: 1.5,
        },
      });
      handles.activator = activator;
      stopList.push(['thaw-activator', () => activator.stop()]);
      staticTargets.push({ address: `127.0.0.1:${activator.adminPort}`, labels: { component: 'thaw-activator' } });
      say(`  thaw-activator   ${activator.base} (admin ${activator.adminBase}/models)`);
    }
    prom.setTargets(staticTargets);

    cluster = new Cluster({
      scalerAddress: scaler.grpcAddress,
      models,
      // The policy's horizon: this stack's replica start (its weights load)
      // plus one KEDA poll, as an operator would measure and set it; and the
      // replicas' batch size (vLLM's --max-num-seqs), for the level's headroom.
      // Not lateAfterSeconds: the activators publish theirs with their queue.
      // Every request goes through the activator: it says when a model is idle.
      metadata: {
        targetTokensPerSecond: opt.targetTokensPerSecond, targetQueueLength: 10, idleSignal: 'activators',
        coldStartSeconds: opt.coldStartSeconds + opt.pollingInterval,
        replicaConcurrency: opt.maxBatch, ...opt.triggerMetadata,
      },
      pollingIntervalMs: opt.pollingInterval * 1000,
      cooldownMs: opt.cooldown * 1000,
      maxReplicaCount: opt.maxReplicas,
      hpaSyncMs: opt.hpaSync * 1000,
      behavior: defaultBehavior(opt.hpaSync * 1000),
      replica: { bin: binPath('thaw-fake-vllm'), args: replicaArgs, readinessPeriodMs: 250, terminationGraceMs: 30000, drainMinMs: 1000 },
      endpointsDir,
      onScrapeTargets: (list) => prom.setTargets([...staticTargets, ...list]),
      log: (s) => stackLog.write(`${new Date().toISOString()} ${s}\n`),
    });
    const scaleEvents = [];
    cluster.on('scale', (e) => {
      scaleEvents.push(e);
      note(`${e.model}: replicas ${e.from} → ${e.to} by ${e.by} (${e.reason})`);
    });
    cluster.on('pod', (e) => {
      if (e.state === 'ready') note(`${e.model}: ${e.pod} ready after ${(e.coldStartMs / 1000).toFixed(1)} s cold start`);
      else if (e.state === 'failed') note(`${e.model}: ${e.pod} FAILED`);
      stackLog.write(`${new Date(e.t).toISOString()} pod ${e.pod} ${e.state}\n`);
    });
    // The first poll makes the scaler know every ScaledObject and opens the
    // push streams before traffic starts, as a deployed KEDA would have.
    cluster.start();
    await sleep(Math.min(2000, opt.pollingInterval * 1000 + 200));

    // Replay window: whatever is left of --duration minus the tail.
    const replayStartMs = Date.now();
    const budget = opt.duration - (replayStartMs - startMs) / 1000;
    const sendUntil = budget - opt.tailSeconds;
    const schedule = fullSchedule.filter((e) => e.at < sendUntil);
    const notSent = fullSchedule.length - schedule.length;
    const replaySeconds = schedule.length ? schedule.at(-1).at : 0;
    if (!opt.noActivator) {
      loadgen = new LoadGen({ schedule, models, target: { host: '127.0.0.1', port: handles.activator.port } });
    } else {
      router = new DirectRouter({ cluster, redisCli: (...a) => handles.redis.cli(...a) });
      loadgen = new LoadGen({ schedule, models, router });
    }
    note(`replay started: ${schedule.length} requests over ${replaySeconds.toFixed(0)} s${notSent ? ` (${notSent} beyond --duration not sent)` : ''}`);
    loadgen.start(replayStartMs);

    // Sampling, view and end conditions, once a second.
    const samples = [];
    let lastScaler = null;
    let lastActivator = null;
    let phase = 'replaying';
    let lastProgress = 0;
    if (tty) { clearScreen(); hideCursor(); }
    const hardEndMs = startMs + opt.duration * 1000;
    for (let tick = 0; ; tick++) {
      const nextTick = replayStartMs + (tick + 1) * 1000;
      const [sc, ac] = await Promise.all([
        getJson(`${scaler.httpBase}/models`),
        handles.activator ? getJson(`${handles.activator.adminBase}/models`) : null,
      ]);
      if (sc) lastScaler = sc;
      if (ac) lastActivator = ac;
      const now = Date.now();
      const snap = cluster.snapshot();
      const sample = { t: (now - replayStartMs) / 1000, models: {} };
      for (const name of models) {
        const c = loadgen.counters[name];
        const s = snap[name];
        const scEntry = Array.isArray(lastScaler) ? lastScaler.find((x) => x.model === name) : null;
        const acEntry = lastActivator?.models?.find?.((x) => x.name === name);
        const held = router ? router.heldCount(name) : (acEntry?.held ?? 0);
        sample.models[name] = {
          sent: c.sent, answered: c.answered, ok: c.ok, failed: c.failed, lost: c.lost, inflight: c.inflight,
          heldTotal: c.held, held, requestedTokens: c.requestedTokens, tokens: c.tokens,
          desired: s.desired, pods: s.pods, ready: s.ready, terminating: s.terminating,
          scalerDesired: scEntry?.desired ?? null, scalerReason: scEntry?.reason ?? null,
          scalerActive: scEntry?.active ?? null, tokenRate: scEntry?.inputs?.tokenRate ?? null,
          activatorState: acEntry?.state ?? null,
        };
      }
      samples.push(sample);

      // Phase and end conditions.
      const inflight = loadgen.inflight.size;
      if (phase === 'replaying' && loadgen.doneSending()) phase = 'finishing';
      if (phase === 'finishing' && inflight === 0) phase = 'idle';
      if (phase === 'idle' && cluster.idle()) endReason = 'completed';
      if (interrupted) endReason = 'interrupted';
      if (!endReason && now >= hardEndMs) endReason = 'duration';

      // View.
      const prev = samples[samples.length - 6] ?? samples[0];
      const dt = Math.max(0.5, sample.t - prev.t);
      const totalsNow = { sent: 0, ok: 0, failed: 0, lost: 0, inflight: 0, held: 0, tokens: 0 };
      for (const name of models) {
        const m = sample.models[name];
        totalsNow.sent += m.sent; totalsNow.ok += m.ok; totalsNow.failed += m.failed; totalsNow.lost += m.lost;
        totalsNow.inflight += m.inflight; totalsNow.held += m.heldTotal; totalsNow.tokens += m.tokens;
      }
      const rs = cluster.replicaSeconds(now);
      totalsNow.replicaSeconds = Object.values(rs).reduce((a, b) => a + b, 0);
      totalsNow.coldStarts = scaleEvents.filter((e) => e.from === 0 && e.to > 0).length;
      totalsNow.replicaStarts = cluster.pods().length;
      // Progress by trace time; the tail (in-flight requests, then the
      // cooldown back to zero) is estimated from the scaling settings.
      const linger = opt.cooldown + opt.scalerStabilization + Number.parseFloat(opt.rateWindow) + 2 * opt.pollingInterval;
      const replayLeft = Math.max(0, replaySeconds - sample.t);
      const expectedEnd = replayStartMs + (replaySeconds + linger) * 1000;
      const view = {
        phase, now, elapsed: (now - startMs) / 1000,
        timeLeft: Math.min((hardEndMs - now) / 1000, phase === 'replaying' ? replayLeft + linger : Math.max(0, (expectedEnd - now) / 1000)),
        hardLeft: (hardEndMs - now) / 1000,
        progress: Math.min(0.99, (now - replayStartMs) / ((replaySeconds + linger) * 1000)),
        traceName: path.basename(opt.trace), scheduled: schedule.length, sent: totalsNow.sent, inflight,
        speedup: opt.speedup, mode, outDir: shown(opt.out), recent,
        totals: totalsNow,
        models: models.map((name) => {
          const m = sample.models[name];
          const p = prev.models[name];
          return {
            name, reqPerSec: (m.sent - p.sent) / dt, tokPerSec: (m.tokens - p.tokens) / dt,
            inflight: m.inflight, held: m.held, ready: m.ready, desired: m.desired, pods: m.pods, terminating: m.terminating,
            scaler: m.scalerDesired !== null ? { desired: m.scalerDesired, reason: m.scalerReason, active: m.scalerActive } : null,
            lastScale: snap[name].lastScale,
          };
        }),
      };
      if (endReason) view.progress = 1;
      if (tty) drawTty(view);
      else if (!opt.quiet && (now - lastProgress >= 5000 || endReason)) {
        console.log(progressLine(view));
        lastProgress = now;
      }
      if (endReason) break;
      await sleep(Math.max(0, Math.min(1000, nextTick - Date.now())));
    }
    if (tty) showCursor();

    // Shut down: requests first (anything still in flight at the bound is
    // lost and says so), then the cluster, then the services.
    loadgen.stopSending();
    if (endReason !== 'completed') {
      await loadgen.waitIdle(endReason === 'interrupted' ? 0 : 2000);
      loadgen.abortAll(endReason === 'interrupted' ? 'interrupted' : 'cut_by_duration');
    }
    let activatorMetrics = null;
    if (handles.activator) {
      try {
        const res = await fetch(`${handles.activator.adminBase}/metrics`, { signal: AbortSignal.timeout(2000) });
        activatorMetrics = await res.text();
      } catch { /* reported as missing */ }
    }
    const endMs = Date.now();
    const replicaSeconds = cluster.replicaSeconds(endMs);
    await cluster.stop();
    report = buildReport({
      records: loadgen.records, samples, scaleEvents, pods: cluster.pods(), replicaSeconds, models,
      meta: {
        command: `scripts/demo.sh ${process.argv.slice(2).join(' ')}`.trim(),
        mode: opt.noActivator ? 'no-activator' : 'activator',
        endReason,
        wallSeconds: (endMs - startMs) / 1000,
        replaySeconds: (endMs - replayStartMs) / 1000,
        scheduled: fullSchedule.length,
        // Beyond --duration, or not yet due when the run was interrupted.
        notSent: fullSchedule.length - loadgen.records.length,
        config: { ...opt, models, replicaArgs },
        scalerFlags: handles.scalerFlags,
        kedaCalls: cluster.calls,
        kedaErrors: cluster.grpcErrors,
      },
    });
    if (handles.activator) {
      // The activator's own books, to compare with what the clients saw.
      report.activator = activatorMetrics ? parseActivatorMetrics(activatorMetrics) : { error: 'no /metrics answer at the end' };
      report.activator.models = lastActivator?.models ?? null;
    }
    fs.writeFileSync(path.join(opt.out, 'report.json'), `${JSON.stringify(report, null, 2)}\n`);
    fs.writeFileSync(path.join(opt.out, 'timeline.svg'), timelineSvg({
      samples, models, scaleEvents, t0Ms: replayStartMs,
      title: `Thaw demo: ${path.basename(opt.trace)} ×${opt.speedup}, ${models.length} model(s), ${report.mode}`,
    }));
    fs.writeFileSync(path.join(opt.out, 'timeline.json'), `${JSON.stringify(samples)}\n`);
    fs.writeFileSync(path.join(opt.out, 'requests.jsonl'), loadgen.records.map((r) => JSON.stringify({
      seq: r.seq, model: r.model, api: r.api, stream: r.stream, promptTokens: r.promptTokens, maxTokens: r.maxTokens,
      scheduledAt: r.scheduledAt, sentAt: (r.sentMs - replayStartMs) / 1000, status: r.status, outcome: r.outcome, error: r.error,
      held: r.held, holdMs: r.holdMs, ttftMs: r.firstTokenMs !== null ? r.firstTokenMs - r.sentMs : null,
      totalMs: r.doneMs !== null ? r.doneMs - r.sentMs : null, tokens: r.usageTokens ?? r.tokens,
    })).join('\n') + '\n');
    fs.writeFileSync(path.join(opt.out, 'scale-events.json'), `${JSON.stringify(scaleEvents.map((e) => ({ ...e, t: (e.t - replayStartMs) / 1000 })), null, 1)}\n`);
    exitCode = report.ok ? 0 : 1;
    if (endReason === 'interrupted') exitCode = 130;
  } finally {
    if (tty) showCursor();
    router?.close();
    loadgen?.close();
    if (cluster && !cluster.stopped) await cluster.stop().catch(() => {});
    for (const [, stop] of stopList.reverse()) {
      try { await stop(); } catch { /* reported through exit codes below */ }
    }
    // Every process's output, for looking into a run afterwards.
    const logs = [];
    if (handles.redis?.process) logs.push(['redis-server', handles.redis.process]);
    if (handles.prom) logs.push(['prometheus', handles.prom.proc]);
    if (handles.scaler) logs.push(['thaw-scaler', handles.scaler.proc]);
    if (handles.activator) logs.push(['thaw-activator', handles.activator.proc]);
    for (const p of cluster?.procs ?? []) logs.push([`replica-${p.name}`, p]);
    for (const [name, p] of logs) {
      try { fs.writeFileSync(path.join(opt.out, 'logs', `${name}.log`), `${p.output()}\n`); } catch { /* best effort */ }
    }
    stackLog.end();
    // Every process must have ended cleanly: a crash (or a sanitizer
    // report in an instrumented build) fails the run like a lost request.
    if (report) {
      report.processExits = Object.fromEntries(logs.map(([name, p]) => [name, p.exitCode]));
      report.unexpectedExits = logs.filter(([, p]) => p.exitCode !== 0).map(([name, p]) => `${name}: ${p.exitCode}`);
      if (report.unexpectedExits.length && endReason !== 'interrupted') {
        report.ok = false;
        if (exitCode === 0) exitCode = 1;
      }
      fs.writeFileSync(path.join(opt.out, 'report.json'), `${JSON.stringify(report, null, 2)}\n`);
    }
  }
  if (report) {
    console.log(summaryText(report, shown(opt.out)));
    if (report.unexpectedExits.length) console.log(`processes that did not exit with 0: ${report.unexpectedExits.join(', ')} (logs in ${shown(path.join(opt.out, 'logs'))})`);
  }
  return exitCode;
}

/**
 * From the activator's /metrics: requests accepted, outcomes by model
 * ({model: {outcome: n}}) and cold starts by model.
 */
function parseActivatorMetrics(text) {
  const out = { accepted: null, outcomes: {}, coldStarts: {} };
  for (const line of text.split('\n')) {
    const m = /^(thaw_activator_[a-z_]+)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    const v = Number(m[3]);
    if (m[1] === 'thaw_activator_requests_accepted_total') out.accepted = v;
    else if (m[1] === 'thaw_activator_requests_total' && v > 0) {
      (out.outcomes[labels.model ?? '?'] ??= {})[labels.outcome ?? '?'] = v;
    } else if (m[1] === 'thaw_activator_cold_starts_total') out.coldStarts[labels.model ?? '?'] = v;
  }
  return out;
}

main().then((code) => {
  process.exitCode = code;
  // grpc-js and keep-alive sockets may hold the loop open; everything of ours is stopped.
  setTimeout(() => process.exit(code), 200).unref();
}, (err) => {
  if (process.stdout.isTTY) showCursor();
  console.error(`demo failed: ${err.stack ?? err.message}`);
  process.exit(1);
});
