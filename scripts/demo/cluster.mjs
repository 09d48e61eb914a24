// The local cluster: plays KEDA, the HorizontalPodAutoscaler and the
// Deployment controller for one ScaledObject per model, over real gRPC
// against thaw-scaler, with every replica a real thaw-fake-vllm process.
//
// KEDA (external-push trigger; ../../../shared/REFERENCE.md):
//   - StreamIsActive is open per ScaledObject; a pushed `true` scales a
//     zero-replica target to max(minReplicaCount, 1) at once; `false` is
//     ignored. A broken stream is reopened after 2 s, doubling to 60 s; a
//     clean end resets the backoff.
//   - Every pollingInterval: GetMetricSpec, GetMetrics, IsActive. Active
//     refreshes lastActiveTime (and scales 0 -> 1); inactive with no error
//     scales to zero once lastActiveTime is cooldownPeriod old; an error
//     changes nothing.
// HPA (kubernetes pkg/controller/podautoscaler), every sync period, only
// while the target has replicas (at 0 it is disabled, KEDA owns 0 <-> 1):
//   - external metric, AverageValue: ratio = value / (target * statusReplicas);
//     within 10 % tolerance keep the count, else ceil(value / target);
//   - stabilization windows (up: min of recent recommendations, down: max),
//     then rate limits from the scale-up/down policies (selectPolicy Max),
//     then minReplicas (max(minReplicaCount, 1)) and maxReplicas.
// Deployment controller: creates replica processes up to spec.replicas;
// scale-down removes not-ready pods first, then the newest. Readiness probe
// is GET /health; ready pods are published to the activator's endpoints file.
// Deleting a ready pod: out of the endpoints file first, then wait until it
// has no request running or waiting (what vLLM's graceful shutdown does on
// SIGTERM; the fake server exits at once, so the wait happens here), bounded
// by the termination grace period, then SIGTERM.

import { EventEmitter } from 'node:events';
import path from 'node:path';

import { grpcClient } from '../../test/integration/lib/harness.mjs';
import { spawnService, writeAtomic } from './stack.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** HPA defaults (autoscaling/v2 behavior), periods in ms. */
export function defaultBehavior(periodMs = 15000) {
  return {
    scaleUp: {
      stabilizationMs: 0,
      selectPolicy: 'Max',
      policies: [{ type: 'Percent', value: 100, periodMs }, { type: 'Pods', value: 4, periodMs }],
    },
    // Thaw stabilizes scale-down itself: the README asks for a 0 s HPA window.
    scaleDown: {
      stabilizationMs: 0,
      selectPolicy: 'Max',
      policies: [{ type: 'Percent', value: 100, periodMs }],
    },
  };
}

/** KEDA's reading of a metric value: float wins when > 0; NaN, Inf, negatives are 0. */
export function metricNumber(floatV, intV) {
  const f = Number(floatV);
  if (Number.isFinite(f) && f > 0) return f;
  const i = Number(intV);
  return Number.isFinite(i) && i > 0 ? i : 0;
}

/**
 * The HPA replica proposal for one AverageValue external metric
 * (GetExternalPerPodMetricReplicas + getUsageRatioReplicaCount).
 */
export function hpaProposal(value, target, statusReplicas, tolerance = 0.1) {
  if (!(target > 0)) return statusReplicas;
  if (statusReplicas === 0) return Math.ceil(value / target);
  const ratio = value / (target * statusReplicas);
  if (Math.abs(1 - ratio) <= tolerance) return statusReplicas;
  return Math.ceil(ratio * statusReplicas);
}

/** Replicas added (sign > 0) or removed (sign < 0) by events within periodMs. */
function changeInPeriod(events, now, periodMs, sign) {
  let n = 0;
  for (const e of events) {
    if (now - e.t <= periodMs && Math.sign(e.delta) === sign) n += Math.abs(e.delta);
  }
  return n;
}

/**
 * HPA normalization (normalizeDesiredReplicasWithBehaviors): stabilize the
 * proposal against recent recommendations, then apply rate limits and
 * min/max. recs: [{t, r}] (the caller appends the proposal afterwards).
 */
export function hpaNormalize({ proposal, current, recs, events, now, behavior, minReplicas, maxReplicas }) {
  let up = proposal;
  let down = proposal;
  for (const rec of recs) {
    if (now - rec.t < behavior.scaleUp.stabilizationMs) up = Math.min(up, rec.r);
    if (now - rec.t < behavior.scaleDown.stabilizationMs) down = Math.max(down, rec.r);
  }
  let desired = current;
  if (desired < up) desired = up;
  if (desired > down) desired = down;
  let reason = desired === proposal ? 'metric' : 'stabilized';

  let upLimit = behavior.scaleUp.selectPolicy === 'Min' ? Infinity : -Infinity;
  for (const p of behavior.scaleUp.policies) {
    const start = current - changeInPeriod(events, now, p.periodMs, 1);
    const lim = p.type === 'Pods' ? start + p.value : Math.ceil(start * (1 + p.value / 100));
    upLimit = behavior.scaleUp.selectPolicy === 'Min' ? Math.min(upLimit, lim) : Math.max(upLimit, lim);
  }
  if (upLimit < current) upLimit = current;
  let downLimit = behavior.scaleDown.selectPolicy === 'Min' ? -Infinity : Infinity;
  for (const p of behavior.scaleDown.policies) {
    const start = current + changeInPeriod(events, now, p.periodMs, -1);
    const lim = p.type === 'Pods' ? start - p.value : Math.ceil(start * (1 - p.value / 100));
    downLimit = behavior.scaleDown.selectPolicy === 'Min' ? Math.max(downLimit, lim) : Math.min(downLimit, lim);
  }
  if (downLimit > current) downLimit = current;
  const maxAllowed = Math.min(maxReplicas, upLimit);
  const minAllowed = Math.max(minReplicas, downLimit);
  if (desired > maxAllowed) { desired = maxAllowed; reason = maxAllowed === maxReplicas ? 'max_replicas' : 'scale_up_limit'; }
  if (desired < minAllowed) { desired = minAllowed; reason = minAllowed === minReplicas ? 'min_replicas' : 'scale_down_limit'; }
  return { desired, reason };
}

/**
 * opts:
 *   scalerAddress        host:port of thaw-scaler's gRPC
 *   models               names (one Deployment + ScaledObject each)
 *   metadata             trigger metadata added to {scalerAddress, model}
 *   pollingIntervalMs, cooldownMs, minReplicaCount (0), maxReplicaCount
 *   hpaSyncMs, tolerance (0.1), behavior (defaultBehavior)
 *   replica: {bin, args (array, appended), readinessPeriodMs,
 *             terminationGraceMs, drainMinMs}
 *   endpointsDir         one <model>.endpoints file each (activator backend)
 *   onScrapeTargets(list) called with [{address, labels}] of live replicas
 *   log(line)            optional event log
 * Events: 'scale' {t, model, from, to, by, reason}, 'pod' {t, model, pod, state}.
 */
export class Cluster extends EventEmitter {
  constructor(opts) {
    super();
    this.opts = {
      minReplicaCount: 0, maxReplicaCount: 8, pollingIntervalMs: 2000, cooldownMs: 30000,
      hpaSyncMs: 3000, tolerance: 0.1, metadata: {}, ...opts,
    };
    this.opts.behavior = opts.behavior ?? defaultBehavior(this.opts.hpaSyncMs);
    this.client = grpcClient(this.opts.scalerAddress, { deadlineMs: 5000 });
    this.models = new Map();
    this.podSeq = 0;
    this.procs = []; // every replica process, for log files
    this.stopped = false;
    this.timers = [];
    this.grpcErrors = 0;
    this.calls = { GetMetricSpec: 0, GetMetrics: 0, IsActive: 0, StreamIsActive: 0 };
    this.log = opts.log ?? (() => {});
    for (const name of this.opts.models) {
      const file = path.join(this.opts.endpointsDir, `${name}.endpoints`);
      writeAtomic(file, '');
      this.models.set(name, {
        name,
        endpointsFile: file,
        ref: {
          name: `${name}-so`,
          namespace: 'models',
          scalerMetadata: Object.fromEntries(Object.entries({
            scalerAddress: this.opts.scalerAddress, model: name, ...this.opts.metadata,
          }).map(([k, v]) => [k, String(v)])),
        },
        replicas: 0, // Deployment spec.replicas
        pods: [],
        keda: { lastActiveMs: null, polling: false, lastActive: null, lastMetric: null, lastError: null, pushes: 0, stream: null, backoffMs: 2000 },
        hpa: { recs: [], events: [], syncing: false, lastProposal: null, lastReason: null, lastMetric: null },
        scaleFromZero: 0,
        scaleToZero: 0,
        lastScale: null,
        publishedEndpoints: '',
      });
    }
  }

  now() { return Date.now(); }

  start() {
    for (const m of this.models.values()) this.openStream(m);
    this.timers.push(setInterval(() => { for (const m of this.models.values()) this.kedaPoll(m); }, this.opts.pollingIntervalMs));
    this.timers.push(setInterval(() => { for (const m of this.models.values()) this.hpaSync(m); }, this.opts.hpaSyncMs));
    for (const m of this.models.values()) this.kedaPoll(m);
  }

  // ---- KEDA ---------------------------------------------------------------

  openStream(m) {
    if (this.stopped) return;
    this.calls.StreamIsActive++;
    const s = this.client.streamIsActive(m.ref);
    m.keda.stream = s;
    let seen = 0;
    let finished = false;
    const check = () => {
      for (; seen < s.messages.length; seen++) {
        const { msg } = s.messages[seen];
        m.keda.pushes++;
        // KEDA acts on pushed true only; false waits for the polling loop.
        if (msg.result === true) this.requestScale(m, true, false, 'keda-push');
      }
      if ((s.ended || s.error) && !finished) {
        finished = true;
        if (this.stopped) return;
        const clean = !s.error;
        if (clean) m.keda.backoffMs = 2000;
        const wait = m.keda.backoffMs;
        if (!clean) m.keda.backoffMs = Math.min(60000, m.keda.backoffMs * 2);
        this.log(`keda stream ${m.name} ended (${clean ? 'clean' : s.error.message}); reopening in ${wait} ms`);
        const t = setTimeout(() => this.openStream(m), wait);
        this.timers.push(t);
      }
    };
    s.call.on('data', () => setImmediate(check));
    s.call.on('end', () => setImmediate(check));
    s.call.on('error', () => setImmediate(check));
    s.call.on('status', () => setImmediate(check));
  }

  /** GetMetricSpec + GetMetrics + IsActive, as KEDA's scale loop does. */
  async queryScaler(m) {
    this.calls.GetMetricSpec++;
    const spec = await this.client.getMetricSpec(m.ref);
    const ms = spec.metricSpecs?.[0];
    if (!ms) throw new Error('empty metric spec');
    this.calls.GetMetrics++;
    const res = await this.client.getMetrics({ scaledObjectRef: m.ref, metricName: ms.metricName });
    const mv = res.metricValues?.[0];
    if (!mv) throw new Error('no metric value');
    this.calls.IsActive++;
    const active = await this.client.isActive(m.ref);
    return {
      metricName: ms.metricName,
      target: metricNumber(ms.targetSizeFloat, ms.targetSize),
      value: metricNumber(mv.metricValueFloat, mv.metricValue),
      active: active.result === true,
    };
  }

  async kedaPoll(m) {
    if (this.stopped || m.keda.polling) return;
    m.keda.polling = true;
    try {
      const r = await this.queryScaler(m);
      m.keda.lastMetric = r;
      m.keda.lastActive = r.active;
      m.keda.lastError = null;
      this.requestScale(m, r.active, false, 'keda-poll');
    } catch (e) {
      this.grpcErrors++;
      m.keda.lastError = e.details ?? e.message;
      this.requestScale(m, false, true, 'keda-poll');
    } finally {
      m.keda.polling = false;
    }
  }

  /** KEDA's scale executor for a ScaledObject (RequestScale). */
  requestScale(m, isActive, isError, by) {
    if (this.stopped) return;
    const now = this.now();
    if (isActive) {
      m.keda.lastActiveMs = now;
      if (m.replicas === 0) {
        m.scaleFromZero++;
        this.setReplicas(m, Math.max(this.opts.minReplicaCount, 1), by, 'activated');
      }
      return;
    }
    if (isError) return;
    if (m.replicas > 0 && this.opts.minReplicaCount === 0 &&
        (m.keda.lastActiveMs === null || now - m.keda.lastActiveMs >= this.opts.cooldownMs)) {
      m.scaleToZero++;
      this.setReplicas(m, 0, by, 'cooldown_passed');
    }
  }

  // ---- HPA ----------------------------------------------------------------

  async hpaSync(m) {
    if (this.stopped || m.hpa.syncing) return;
    // HPA is disabled while the target is at zero (its minReplicas is >= 1).
    if (m.replicas === 0) return;
    m.hpa.syncing = true;
    try {
      let r;
      try {
        r = await this.queryScaler(m);
      } catch (e) {
        this.grpcErrors++;
        m.hpa.lastReason = `metric_error: ${e.details ?? e.message}`;
        return; // FailedGetExternalMetric: no change
      }
      if (this.stopped || m.replicas === 0) return; // KEDA scaled to zero meanwhile
      m.hpa.lastMetric = r;
      const now = this.now();
      const current = m.replicas;
      const statusReplicas = this.livePods(m).length;
      const proposal = hpaProposal(r.value, r.target, statusReplicas, this.opts.tolerance);
      const { desired, reason } = hpaNormalize({
        proposal, current, recs: m.hpa.recs, events: m.hpa.events, now, behavior: this.opts.behavior,
        minReplicas: Math.max(this.opts.minReplicaCount, 1), maxReplicas: this.opts.maxReplicaCount,
      });
      m.hpa.recs.push({ t: now, r: proposal });
      const keep = Math.max(this.opts.behavior.scaleUp.stabilizationMs, this.opts.behavior.scaleDown.stabilizationMs, 1000);
      m.hpa.recs = m.hpa.recs.filter((x) => now - x.t <= keep);
      m.hpa.lastProposal = proposal;
      m.hpa.lastReason = reason;
      if (desired !== current) {
        m.hpa.events.push({ t: now, delta: desired - current });
        const maxPeriod = Math.max(...this.opts.behavior.scaleUp.policies.map((p) => p.periodMs),
          ...this.opts.behavior.scaleDown.policies.map((p) => p.periodMs));
        m.hpa.events = m.hpa.events.filter((x) => now - x.t <= maxPeriod);
        this.setReplicas(m, desired, 'hpa', `${reason} value=${r.value} target=${r.target}`);
      }
    } finally {
      m.hpa.syncing = false;
    }
  }

  // ---- Deployment controller --------------------------------------------

  setReplicas(m, n, by, reason) {
    if (n === m.replicas) return;
    const ev = { t: this.now(), model: m.name, from: m.replicas, to: n, by, reason };
    m.replicas = n;
    m.lastScale = ev;
    this.log(`scale ${m.name} ${ev.from} -> ${ev.to} by ${by} (${reason})`);
    this.emit('scale', ev);
    this.reconcile(m);
  }

  livePods(m) { return m.pods.filter((p) => p.state === 'starting' || p.state === 'ready'); }

  reconcile(m) {
    if (this.stopped) return;
    let live = this.livePods(m);
    while (live.length < m.replicas) {
      this.createPod(m);
      live = this.livePods(m);
    }
    while (live.length > m.replicas) {
      // ReplicaSet deletion order: not ready before ready, then newest first.
      const victim = [...live].sort((a, b) => (a.state === 'ready') - (b.state === 'ready') || b.createdMs - a.createdMs)[0];
      this.deletePod(m, victim);
      live = this.livePods(m);
    }
  }

  podEvent(m, pod, state, extra = {}) {
    pod.state = state;
    this.emit('pod', { t: this.now(), model: m.name, pod: pod.id, state, ...extra });
  }

  createPod(m) {
    const id = `${m.name}-${++this.podSeq}`;
    const pod = { id, model: m.name, state: 'starting', createdMs: this.now(), readyMs: null, stoppedMs: null, port: null, proc: null, deleting: false };
    m.pods.push(pod);
    this.podEvent(m, pod, 'starting');
    this.runPod(m, pod).catch((e) => {
      this.log(`pod ${id} failed: ${e.message}`);
      pod.error = e.message;
      this.finishPod(m, pod, 'failed');
      // The ReplicaSet replaces a failed pod.
      if (!this.stopped) setTimeout(() => this.reconcile(m), 1000);
    });
  }

  async runPod(m, pod) {
    const o = this.opts.replica;
    const portFile = path.join(this.opts.endpointsDir, `${pod.id}.port`);
    pod.spawning = spawnService(o.bin, [...o.args, '--model', m.name, '--listen', '127.0.0.1:0', '--port-file', portFile], {
      name: pod.id, readyLogRegex: /event=listening port=\d+/, timeoutMs: 15000,
    });
    pod.proc = await pod.spawning;
    this.procs.push(pod.proc);
    const lm = await pod.proc.waitForLog(/event=listening port=(\d+)/);
    pod.port = Number(lm[1]);
    if (pod.state !== 'starting') return; // deleted while spawning: deletePod stops it
    pod.proc.exited.then((code) => {
      if (pod.state === 'starting' || pod.state === 'ready') {
        this.log(`pod ${pod.id} exited unexpectedly with ${code}`);
        pod.error = `exited with ${code}`;
        this.finishPod(m, pod, 'failed');
        if (!this.stopped) setTimeout(() => this.reconcile(m), 1000);
      }
    });
    this.publishTargets();
    // Readiness probe.
    while (pod.state === 'starting' && !this.stopped) {
      if (await httpStatus(`http://127.0.0.1:${pod.port}/health`, 1000) === 200) {
        if (pod.state !== 'starting') break;
        pod.readyMs = this.now();
        this.podEvent(m, pod, 'ready', { coldStartMs: pod.readyMs - pod.createdMs });
        this.publishEndpoints(m);
        break;
      }
      await sleep(o.readinessPeriodMs ?? 500);
    }
  }

  async deletePod(m, pod) {
    const wasReady = pod.state === 'ready';
    this.podEvent(m, pod, 'terminating');
    this.publishEndpoints(m);
    if (wasReady && pod.port) {
      const o = this.opts.replica;
      const graceEnd = this.now() + (o.terminationGraceMs ?? 30000);
      // Let every endpoints reader see the removal before looking for idleness.
      await sleep(o.drainMinMs ?? 1000);
      while (!this.stopped && this.now() < graceEnd) {
        const busy = await replicaBusy(pod.port);
        if (busy <= 0) break; // idle, or gone already
        await sleep(200);
      }
    }
    if (!pod.proc && pod.spawning) await pod.spawning.catch(() => {});
    if (pod.proc) await pod.proc.stop('SIGTERM', 5000);
    this.finishPod(m, pod, 'stopped');
    this.publishTargets();
  }

  finishPod(m, pod, state) {
    if (pod.stoppedMs !== null) return;
    pod.stoppedMs = this.now();
    this.podEvent(m, pod, state);
    if (pod.proc && pod.proc.exitCode === null) pod.proc.stop('SIGTERM', 5000);
    this.publishEndpoints(m);
    this.publishTargets();
  }

  publishEndpoints(m) {
    const text = m.pods.filter((p) => p.state === 'ready').map((p) => `127.0.0.1:${p.port}\n`).join('');
    if (text === m.publishedEndpoints) return;
    m.publishedEndpoints = text;
    writeAtomic(m.endpointsFile, text);
    this.emit('endpoints', { model: m.name, endpoints: text.split('\n').filter(Boolean) });
  }

  publishTargets() {
    if (!this.opts.onScrapeTargets) return;
    const list = [];
    for (const m of this.models.values()) {
      for (const p of m.pods) {
        if (p.port && p.stoppedMs === null) list.push({ address: `127.0.0.1:${p.port}`, labels: { component: 'replica', model: m.name, pod: p.id } });
      }
    }
    this.opts.onScrapeTargets(list);
  }

  // ---- State for the view and the report --------------------------------

  /** Ready endpoints of a model: [{pod, port}] (for the no-activator mode). */
  readyEndpoints(name) {
    const m = this.models.get(name);
    return m ? m.pods.filter((p) => p.state === 'ready').map((p) => ({ pod: p.id, port: p.port })) : [];
  }

  snapshot() {
    const out = {};
    for (const m of this.models.values()) {
      out[m.name] = {
        desired: m.replicas,
        pods: this.livePods(m).length,
        ready: m.pods.filter((p) => p.state === 'ready').length,
        terminating: m.pods.filter((p) => p.state === 'terminating').length,
        kedaActive: m.keda.lastActive,
        kedaMetric: m.keda.lastMetric?.value ?? null,
        kedaError: m.keda.lastError,
        hpaProposal: m.hpa.lastProposal,
        hpaReason: m.hpa.lastReason,
        lastScale: m.lastScale,
        scaleFromZero: m.scaleFromZero,
        scaleToZero: m.scaleToZero,
      };
    }
    return out;
  }

  /** Replica-seconds per model up to now (running processes, terminating included). */
  replicaSeconds(now = this.now()) {
    const out = {};
    for (const m of this.models.values()) {
      let s = 0;
      for (const p of m.pods) s += ((p.stoppedMs ?? now) - p.createdMs) / 1000;
      out[m.name] = s;
    }
    return out;
  }

  pods() {
    const out = [];
    for (const m of this.models.values()) {
      for (const p of m.pods) {
        out.push({ id: p.id, model: m.name, state: p.state, createdMs: p.createdMs, readyMs: p.readyMs, stoppedMs: p.stoppedMs, error: p.error ?? null });
      }
    }
    return out;
  }

  idle() {
    for (const m of this.models.values()) {
      if (m.replicas !== 0 || m.pods.some((p) => p.stoppedMs === null)) return false;
    }
    return true;
  }

  /** Stops the control loops and every replica (drain skipped: the run is over). */
  async stop() {
    this.stopped = true;
    for (const t of this.timers) { clearInterval(t); clearTimeout(t); }
    for (const m of this.models.values()) m.keda.stream?.cancel();
    const all = [];
    for (const m of this.models.values()) {
      for (const p of m.pods) {
        if (p.stoppedMs === null) {
          all.push((async () => {
            if (!p.proc && p.spawning) await p.spawning.catch(() => {});
            if (p.proc) await p.proc.stop('SIGTERM', 5000);
            this.finishPod(m, p, 'stopped');
          })());
        }
      }
    }
    await Promise.all(all);
    this.client.close();
  }
}

/** HTTP status of a GET, or 0 on a connection error or timeout. */
export async function httpStatus(url, timeoutMs = 1000) {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return 0;
  }
}

/** Requests running + waiting on a replica (from its vLLM metrics), or -1. */
async function replicaBusy(port) {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(1000) });
    const text = await res.text();
    let n = 0;
    for (const line of text.split('\n')) {
      const mm = /^vllm:num_requests_(running|waiting)(?:\{[^}]*\})?\s+(\S+)/.exec(line);
      if (mm) n += Number(mm[2]);
    }
    return n;
  } catch {
    return -1;
  }
}
