// The demo's live terminal view: a full-screen ANSI table redrawn every
// second when stdout is a terminal, one plain progress line otherwise.

const ESC = '\x1b[';
const C = {
  reset: `${ESC}0m`, bold: `${ESC}1m`, dim: `${ESC}2m`,
  red: `${ESC}31m`, green: `${ESC}32m`, yellow: `${ESC}33m`, blue: `${ESC}34m`, cyan: `${ESC}36m`,
};

const pad = (s, n) => { s = String(s); return s.length >= n ? s.slice(0, n) : s + ' '.repeat(n - s.length); };
const lpad = (s, n) => { s = String(s); return s.length >= n ? s : ' '.repeat(n - s.length) + s; };
const num = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '-');
const int = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : '-');
const visibleLength = (s) => s.replace(/\x1b\[[0-9;]*m/g, '').length;
const padAnsi = (s, n) => s + ' '.repeat(Math.max(0, n - visibleLength(s)));

function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 60 ? `${s}s ago` : `${Math.floor(s / 60)}m${s % 60}s ago`;
}

function bar(frac, width) {
  const f = Math.max(0, Math.min(1, frac || 0));
  const n = Math.round(f * width);
  return '█'.repeat(n) + '░'.repeat(width - n);
}

/** Little replica boxes: ready ■ (green), starting ▫ (yellow), terminating ▪ (dim). */
function replicaBoxes(m) {
  const starting = Math.max(0, m.pods - m.ready);
  const shown = Math.min(12, m.ready + starting + m.terminating);
  let s = C.green + '■'.repeat(Math.min(m.ready, shown)) + C.reset;
  s += C.yellow + '□'.repeat(Math.min(starting, Math.max(0, shown - m.ready))) + C.reset;
  s += C.dim + '▪'.repeat(Math.max(0, shown - m.ready - starting)) + C.reset;
  return padAnsi(s, 12);
}

function phaseText(st) {
  if (st.phase === 'replaying') return `replaying the trace: ${int(st.sent)} of ${int(st.scheduled)} requests sent`;
  if (st.phase === 'finishing') return `trace done; ${int(st.inflight)} requests still in flight`;
  if (st.phase === 'idle') return 'trace done; waiting for every model to scale back to zero';
  return st.phase;
}

/** The full-screen view (a string with ANSI codes). */
export function renderTty(st) {
  const out = [];
  const progress = st.progress ?? 0;
  out.push(`${C.bold}Thaw local demo${C.reset} ${C.dim}— ${st.traceName} (${int(st.scheduled)} requests, ×${st.speedup}) — ${st.mode}${C.reset}`);
  out.push(`${bar(progress, 30)} ${lpad(Math.round(progress * 100), 3)} %   t ${lpad(Math.round(st.elapsed), 4)} s   about ${Math.max(0, Math.round(st.timeLeft))} s left (at most ${Math.max(0, Math.round(st.hardLeft))} s)`);
  out.push(`${C.cyan}${phaseText(st)}${C.reset}`);
  out.push('');
  out.push(C.bold + pad('model', 14) + lpad('req/s', 7) + lpad('tok/s', 8) + lpad('in-flight', 10) + lpad('held', 6) +
    '  ' + pad('replicas ready/desired', 24) + pad('scaler: desired, reason', 28) + 'last scale' + C.reset);
  for (const m of st.models) {
    const held = m.held > 0 ? `${C.yellow}${lpad(m.held, 6)}${C.reset}` : lpad(m.held, 6);
    const sc = m.scaler ? `${m.scaler.desired} ${m.scaler.reason}${m.scaler.active ? '' : ' (inactive)'}` : '-';
    const ls = m.lastScale ? `${m.lastScale.by} ${m.lastScale.from}→${m.lastScale.to} ${ago(st.now - m.lastScale.t)}` : '-';
    out.push(pad(m.name, 14) + lpad(num(m.reqPerSec), 7) + lpad(int(m.tokPerSec), 8) + lpad(m.inflight, 10) + held +
      '  ' + replicaBoxes(m) + pad(`${m.ready}/${m.desired}`, 12) + pad(sc, 28) + ls);
  }
  out.push('');
  const t = st.totals;
  const bad = (n) => (n > 0 ? `${C.red}${int(n)}${C.reset}` : int(n));
  out.push(`requests  ${int(t.sent)} sent · ${C.green}${int(t.ok)} ok${C.reset} · ${bad(t.failed)} failed · ${bad(t.lost)} lost · ${int(t.inflight)} in flight · ${int(t.held)} were held`);
  out.push(`replicas  ${int(t.coldStarts)} scale-from-zero · ${int(t.replicaStarts)} replica starts · ${num(t.replicaSeconds)} replica-seconds · ${int(t.tokens)} tokens`);
  out.push('');
  out.push(`${C.dim}recent events${C.reset}`);
  for (const e of st.recent.slice(-6)) out.push(`${C.dim}${e}${C.reset}`);
  out.push('');
  out.push(`${C.dim}Ctrl-C stops the run (a report is still written to ${st.outDir})${C.reset}`);
  return out.join('\n');
}

/** Clears the screen and draws. */
export function drawTty(st) {
  // Home, overwrite each line and clear its rest, then clear below: no flicker.
  const body = renderTty(st).split('\n').map((l) => `${l}${ESC}K`).join('\n');
  process.stdout.write(`${ESC}H${body}\n${ESC}J`);
}

/** Starts the full-screen view on a clean screen. */
export function clearScreen() { process.stdout.write(`${ESC}H${ESC}2J`); }

export function hideCursor() { process.stdout.write(`${ESC}?25l`); }
export function showCursor() { process.stdout.write(`${ESC}?25h`); }

/** One plain line for logs and CI. */
export function progressLine(st) {
  const parts = st.models.map((m) => `${m.name} ${num(m.reqPerSec)} req/s ${int(m.tokPerSec)} tok/s held ${m.held} replicas ${m.ready}/${m.desired}` +
    (m.scaler ? ` (${m.scaler.reason})` : ''));
  const t = st.totals;
  return `[demo] t=${Math.round(st.elapsed)}s ${Math.round((st.progress ?? 0) * 100)}% ~${Math.max(0, Math.round(st.timeLeft))}s left ${st.phase} ` +
    `sent=${t.sent} ok=${t.ok} failed=${t.failed} lost=${t.lost} inflight=${t.inflight} | ${parts.join(' | ')}`;
}
