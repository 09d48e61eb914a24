// The demo's results: report.json (what a run proved), timeline.svg (demand
// and replicas over time per model, hand-written SVG) and a short summary.

/** Nearest-rank percentile (p in 0..100) of numbers; null when empty. */
export function percentile(values, p) {
  const v = values.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * v.length));
  return v[Math.min(rank, v.length) - 1];
}

const round = (x, d = 1) => (x === null || !Number.isFinite(x) ? null : Number(x.toFixed(d)));

/** Summary of a set of request records (one model or all). */
function summarize(records, { replicaSeconds, coldStarts, replicaStarts }) {
  const answered = records.filter((r) => r.status !== null);
  const ok = records.filter((r) => r.outcome === 'ok');
  const failed = answered.filter((r) => r.outcome !== 'ok');
  const lost = records.filter((r) => r.status === null);
  const failedByStatus = {};
  for (const r of failed) {
    const k = r.status === 200 ? `200:${r.outcome}` : String(r.status);
    failedByStatus[k] = (failedByStatus[k] ?? 0) + 1;
  }
  const lostByReason = {};
  for (const r of lost) {
    const k = r.error ?? r.outcome ?? 'unknown';
    lostByReason[k] = (lostByReason[k] ?? 0) + 1;
  }
  const held = records.filter((r) => r.held);
  const holds = held.map((r) => r.holdMs);
  const ttft = records.filter((r) => r.stream && r.outcome === 'ok' && r.firstTokenMs !== null).map((r) => r.firstTokenMs - r.sentMs);
  const total = ok.map((r) => r.doneMs - r.sentMs);
  const tokens = records.reduce((s, r) => s + (r.outcome === 'ok' ? (r.usageTokens ?? r.tokens) : r.tokens), 0);
  const promptTokens = answered.reduce((s, r) => s + r.promptTokens, 0);
  return {
    requestsSent: records.length,
    answered: answered.length,
    succeeded: ok.length,
    failed: failed.length,
    failedByStatus,
    lost: records.length - answered.length,
    lostByReason,
    streaming: records.filter((r) => r.stream).length,
    heldRequests: held.length,
    heldSucceeded: held.filter((r) => r.outcome === 'ok').length,
    coldStarts,
    replicaStarts,
    holdMs: { p50: round(percentile(holds, 50)), p99: round(percentile(holds, 99)), max: round(percentile(holds, 100)) },
    ttftMs: { p50: round(percentile(ttft, 50)), p99: round(percentile(ttft, 99)) },
    totalMs: { p50: round(percentile(total, 50)), p99: round(percentile(total, 99)) },
    replicaSeconds: round(replicaSeconds, 2),
    tokens,
    promptTokens,
    replicaSecondsPerMillionTokens: tokens > 0 ? round(replicaSeconds / (tokens / 1e6), 1) : null,
  };
}

/**
 * Builds report.json's object.
 *   records   LoadGen records
 *   samples   [{t, models: {name: {...}}}] one a second
 *   scaleEvents, pods  from the cluster
 *   meta      {config, mode, endReason, wallSeconds, scheduled, notSent, ...}
 */
export function buildReport({ records, samples, scaleEvents, pods, replicaSeconds, models, meta }) {
  const perModel = {};
  for (const name of models) {
    const recs = records.filter((r) => r.model === name);
    const ev = scaleEvents.filter((e) => e.model === name);
    const modelPods = pods.filter((p) => p.model === name);
    const s = summarize(recs, {
      replicaSeconds: replicaSeconds[name] ?? 0,
      coldStarts: ev.filter((e) => e.from === 0 && e.to > 0).length,
      replicaStarts: modelPods.length,
    });
    const readySeries = samples.map((x) => x.models[name]?.ready ?? 0);
    const last = samples.at(-1)?.models[name];
    s.scaling = {
      events: ev.length,
      scaleFromZero: ev.filter((e) => e.from === 0 && e.to > 0).length,
      scaleUps: ev.filter((e) => e.to > e.from && e.from > 0).length,
      scaleDowns: ev.filter((e) => e.to < e.from && e.to > 0).length,
      scaleToZero: ev.filter((e) => e.to === 0).length,
      maxDesired: Math.max(0, ...ev.map((e) => e.to)),
      maxReady: Math.max(0, ...readySeries),
      endedAtZero: last ? last.desired === 0 && last.pods === 0 : null,
      replicaColdStartMs: {
        p50: round(percentile(modelPods.filter((p) => p.readyMs).map((p) => p.readyMs - p.createdMs), 50), 0),
        max: round(percentile(modelPods.filter((p) => p.readyMs).map((p) => p.readyMs - p.createdMs), 100), 0),
      },
      failedReplicas: modelPods.filter((p) => p.state === 'failed').length,
    };
    perModel[name] = s;
  }
  const totalRs = Object.values(replicaSeconds).reduce((a, b) => a + b, 0);
  const totals = summarize(records, {
    replicaSeconds: totalRs,
    coldStarts: scaleEvents.filter((e) => e.from === 0 && e.to > 0).length,
    replicaStarts: pods.length,
  });
  const anyModel = (f) => Object.values(perModel).some(f);
  const checks = {
    noLostRequests: totals.lost === 0,
    noFailedRequests: totals.failed === 0,
    scaledFromZeroAndReleasedHeld: totals.coldStarts > 0 && totals.heldSucceeded > 0,
    scaledUpUnderLoad: anyModel((m) => m.scaling.maxReady >= 2),
    returnedToZero: anyModel((m) => m.scaling.scaleToZero > 0) && Object.values(perModel).every((m) => m.scaling.endedAtZero),
  };
  return {
    schemaVersion: 1,
    generatedAt: new Date().toISOString(),
    ...meta,
    notSent: meta.notSent ?? 0,
    totals,
    models: perModel,
    checks,
    ok: checks.noLostRequests && checks.noFailedRequests,
  };
}

// ---------------------------------------------------------------------------
// timeline.svg

const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** Moving average over w samples (centered), for spiky per-second counts. */
function smooth(xs, w) {
  const h = Math.floor(w / 2);
  return xs.map((_, i) => {
    let s = 0;
    let n = 0;
    for (let j = Math.max(0, i - h); j <= Math.min(xs.length - 1, i + h); j++) { s += xs[j]; n++; }
    return n ? s / n : 0;
  });
}

/** A "nice" axis maximum and step for values up to max. */
function niceScale(max, ticks = 4) {
  if (!(max > 0)) return { max: 1, step: 0.25 };
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((s) => s >= raw);
  return { max: step * Math.ceil(max / step), step };
}

/**
 * Per-second series of one model from the samples: requested tok/s of the
 * requests sent (demand), delivered tok/s, req/s, ready, desired, held.
 */
export function seriesFor(samples, name) {
  const out = { t: [], demandTok: [], deliveredTok: [], reqs: [], ready: [], desired: [], pods: [], held: [] };
  for (let i = 0; i < samples.length; i++) {
    const cur = samples[i];
    const prev = samples[i - 1];
    const m = cur.models[name];
    const p = prev?.models[name];
    const dt = prev ? Math.max(0.001, cur.t - prev.t) : 1;
    out.t.push(cur.t);
    out.demandTok.push(p ? (m.requestedTokens - p.requestedTokens) / dt : 0);
    out.deliveredTok.push(p ? (m.tokens - p.tokens) / dt : 0);
    out.reqs.push(p ? (m.sent - p.sent) / dt : 0);
    out.ready.push(m.ready);
    out.desired.push(m.desired);
    out.pods.push(m.pods);
    out.held.push(m.held);
  }
  return out;
}

/** The whole timeline.svg document. */
export function timelineSvg({ samples, models, scaleEvents, title, t0Ms }) {
  const W = 980;
  const PH = 220;          // panel height
  const M = { l: 64, r: 56, t: 34, b: 30 };
  const H = 58 + models.length * (PH + 18) + 24;
  const tMax = Math.max(1, samples.at(-1)?.t ?? 1);
  const xs = niceScale(tMax, 10);
  const x = (t) => M.l + (t / xs.max) * (W - M.l - M.r);
  const parts = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`);
  parts.push(`<rect width="${W}" height="${H}" fill="#ffffff"/>`);
  parts.push(`<text x="${M.l}" y="24" font-size="16" font-weight="bold">${esc(title)}</text>`);
  // Legend.
  const lg = [
    ['rect', '#c7dcf0', 'demand: tokens/s requested (5 s avg)'],
    ['line', '#1f5fa8', 'tokens/s delivered'],
    ['line', '#2e9e44', 'replicas ready'],
    ['dash', '#333333', 'replicas desired'],
    ['rect', '#f5a623', 'requests held'],
    ['vline', '#d0021b', 'scale from zero'],
  ];
  let lx = M.l;
  for (const [kind, color, label] of lg) {
    const y = 42;
    if (kind === 'rect') parts.push(`<rect x="${lx}" y="${y - 8}" width="14" height="9" fill="${color}"/>`);
    else if (kind === 'line') parts.push(`<line x1="${lx}" y1="${y - 4}" x2="${lx + 14}" y2="${y - 4}" stroke="${color}" stroke-width="2.5"/>`);
    else if (kind === 'dash') parts.push(`<line x1="${lx}" y1="${y - 4}" x2="${lx + 14}" y2="${y - 4}" stroke="${color}" stroke-width="1.5" stroke-dasharray="4 3"/>`);
    else parts.push(`<line x1="${lx + 7}" y1="${y - 10}" x2="${lx + 7}" y2="${y + 2}" stroke="${color}" stroke-width="1.5" stroke-dasharray="2 2"/>`);
    parts.push(`<text x="${lx + 19}" y="${y}" font-size="11">${esc(label)}</text>`);
    lx += 30 + label.length * 6.3;
  }

  models.forEach((name, k) => {
    const top = 58 + k * (PH + 18);
    const y0 = top + PH - M.b;     // plot bottom
    const y1 = top + M.t;          // plot top
    const s = seriesFor(samples, name);
    const demand = smooth(s.demandTok, 5);
    const delivered = smooth(s.deliveredTok, 3);
    const tokScale = niceScale(Math.max(1, ...demand, ...delivered) * 1.05);
    const repMax = Math.max(2, ...s.desired, ...s.pods) + 1;
    const yTok = (v) => y0 - (v / tokScale.max) * (y0 - y1);
    const yRep = (v) => y0 - (v / repMax) * (y0 - y1);
    parts.push(`<g>`);
    parts.push(`<text x="${M.l}" y="${top + 18}" font-size="14" font-weight="bold">${esc(name)}</text>`);
    parts.push(`<rect x="${M.l}" y="${y1}" width="${W - M.l - M.r}" height="${y0 - y1}" fill="#fafafa" stroke="#cccccc"/>`);
    // Grid and axes.
    for (let v = 0; v <= tokScale.max + 1e-9; v += tokScale.step) {
      const y = yTok(v);
      parts.push(`<line x1="${M.l}" y1="${y.toFixed(1)}" x2="${W - M.r}" y2="${y.toFixed(1)}" stroke="#e6e6e6"/>`);
      parts.push(`<text x="${M.l - 6}" y="${(y + 4).toFixed(1)}" text-anchor="end" fill="#1f5fa8">${Math.round(v)}</text>`);
    }
    for (let v = 0; v <= repMax; v++) {
      parts.push(`<text x="${W - M.r + 6}" y="${(yRep(v) + 4).toFixed(1)}" fill="#2e9e44">${v}</text>`);
    }
    for (let t = 0; t <= xs.max + 1e-9; t += xs.step) {
      parts.push(`<line x1="${x(t).toFixed(1)}" y1="${y0}" x2="${x(t).toFixed(1)}" y2="${y0 + 4}" stroke="#999999"/>`);
      parts.push(`<text x="${x(t).toFixed(1)}" y="${y0 + 16}" text-anchor="middle" fill="#555555">${Math.round(t)}</text>`);
    }
    parts.push(`<text x="${M.l - 48}" y="${(y0 + y1) / 2}" transform="rotate(-90 ${M.l - 48} ${(y0 + y1) / 2})" text-anchor="middle" fill="#1f5fa8">tokens/s</text>`);
    parts.push(`<text x="${W - 14}" y="${(y0 + y1) / 2}" transform="rotate(90 ${W - 14} ${(y0 + y1) / 2})" text-anchor="middle" fill="#2e9e44">replicas</text>`);
    parts.push(`<text x="${W - M.r}" y="${y0 + 28}" text-anchor="end" fill="#555555">seconds since the replay started</text>`);
    // Demand area.
    if (s.t.length > 1) {
      let d = `M${x(s.t[0]).toFixed(1)},${y0}`;
      for (let i = 0; i < s.t.length; i++) d += ` L${x(s.t[i]).toFixed(1)},${yTok(demand[i]).toFixed(1)}`;
      d += ` L${x(s.t.at(-1)).toFixed(1)},${y0} Z`;
      parts.push(`<path d="${d}" fill="#c7dcf0" stroke="none" opacity="0.9"/>`);
      const line = (vals, yf) => vals.map((v, i) => `${i ? 'L' : 'M'}${x(s.t[i]).toFixed(1)},${yf(v).toFixed(1)}`).join(' ');
      parts.push(`<path d="${line(delivered, yTok)}" fill="none" stroke="#1f5fa8" stroke-width="1.6"/>`);
      const step = (vals) => {
        let p = `M${x(s.t[0]).toFixed(1)},${yRep(vals[0]).toFixed(1)}`;
        for (let i = 1; i < vals.length; i++) p += ` H${x(s.t[i]).toFixed(1)} V${yRep(vals[i]).toFixed(1)}`;
        return p;
      };
      parts.push(`<path d="${step(s.ready)}" fill="none" stroke="#2e9e44" stroke-width="2.5"/>`);
      parts.push(`<path d="${step(s.desired)}" fill="none" stroke="#333333" stroke-width="1.5" stroke-dasharray="5 3"/>`);
    }
    // Held requests: bars along the bottom, height by count (capped).
    const heldMax = Math.max(1, ...s.held);
    for (let i = 0; i < s.t.length; i++) {
      if (s.held[i] > 0) {
        const w = Math.max(1.5, x(s.t[i] + 1) - x(s.t[i]));
        const h = 4 + 16 * (s.held[i] / heldMax);
        parts.push(`<rect x="${x(s.t[i]).toFixed(1)}" y="${(y0 - h).toFixed(1)}" width="${w.toFixed(1)}" height="${h.toFixed(1)}" fill="#f5a623" opacity="0.8"><title>${s.held[i]} held at t=${Math.round(s.t[i])} s</title></rect>`);
      }
    }
    for (const e of scaleEvents.filter((ev) => ev.model === name && ev.from === 0 && ev.to > 0)) {
      const t = (e.t - t0Ms) / 1000;
      if (t < 0 || t > xs.max) continue;
      parts.push(`<line x1="${x(t).toFixed(1)}" y1="${y1}" x2="${x(t).toFixed(1)}" y2="${y0}" stroke="#d0021b" stroke-width="1.2" stroke-dasharray="2 2"><title>scale from zero at t=${t.toFixed(1)} s (${esc(e.by)})</title></line>`);
    }
    parts.push(`</g>`);
  });
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}

/** The few lines printed at the end. */
export function summaryText(report, outDir) {
  const t = report.totals;
  const lines = [];
  const fmt = (x, unit = ' ms') => (x === null || x === undefined ? '-' : `${x}${unit}`);
  const how = { completed: 'finished', duration: 'stopped by --duration', interrupted: 'interrupted' }[report.endReason] ?? report.endReason;
  const via = report.mode === 'activator' ? 'through thaw-activator' : 'without the activator';
  lines.push(`== Thaw demo ${how} after ${Math.round(report.wallSeconds)} s (${via}) ==`);
  lines.push(`requests: ${t.requestsSent} sent, ${t.succeeded} succeeded, ${t.failed} failed${t.failed ? ` ${JSON.stringify(t.failedByStatus)}` : ''}, ${t.lost} lost${t.lost ? ` ${JSON.stringify(t.lostByReason)}` : ''}` +
    (report.notSent ? `, ${report.notSent} not sent (the run ended before they were due)` : ''));
  lines.push(`cold starts: ${t.coldStarts} scale-from-zero, ${t.heldRequests} requests held (hold p50 ${fmt(t.holdMs.p50)}, p99 ${fmt(t.holdMs.p99)}), ${t.heldSucceeded === t.heldRequests ? 'all' : `only ${t.heldSucceeded}`} succeeded`);
  lines.push(`latency: TTFT p50 ${fmt(t.ttftMs.p50)}, p99 ${fmt(t.ttftMs.p99)} (streaming); total p50 ${fmt(t.totalMs.p50)}, p99 ${fmt(t.totalMs.p99)}`);
  lines.push(`cost: ${t.replicaSeconds} replica-seconds for ${t.tokens.toLocaleString('en-US')} tokens = ${fmt(t.replicaSecondsPerMillionTokens, '')} replica-seconds per million tokens`);
  for (const [name, m] of Object.entries(report.models)) {
    lines.push(`  ${name}: ${m.requestsSent} requests, max ${m.scaling.maxReady} ready replicas, ${m.scaling.scaleFromZero} from zero, ${m.scaling.scaleToZero} to zero, ended at zero: ${m.scaling.endedAtZero ? 'yes' : 'no'}`);
  }
  if (report.activator?.accepted !== undefined && report.activator.accepted !== null) {
    const ok = Object.values(report.activator.outcomes ?? {}).reduce((a, o) => a + (o.ok ?? 0), 0);
    lines.push(`thaw-activator's own count: ${report.activator.accepted} accepted, ${ok} answered by a replica`);
  }
  const failedChecks = Object.entries(report.checks).filter(([, v]) => !v).map(([k]) => k);
  lines.push(`checks: ${failedChecks.length ? `not met: ${failedChecks.join(', ')}` : 'all met'}`);
  lines.push(`report: ${outDir}/report.json, plot: ${outDir}/timeline.svg`);
  return lines.join('\n');
}
