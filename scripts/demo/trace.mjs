// Trace loading for the demo: the Azure LLM inference CSV format
// (TIMESTAMP,ContextTokens,GeneratedTokens), sliced, time-compressed and
// spread over N models.
//
// TIMESTAMP is either Azure's wall-clock string "YYYY-MM-DD HH:MM:SS.fffffff"
// (no zone; only differences matter) or a plain number of seconds, which is
// what synthetic traces use.

import fs from 'node:fs';

const AZURE_TS = /^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?$/;

/** Seconds (any origin) from a TIMESTAMP cell, or NaN. */
export function parseTimestamp(cell) {
  const s = cell.trim();
  if (/^[+-]?\d+(\.\d+)?$/.test(s)) return Number(s);
  const m = AZURE_TS.exec(s);
  if (!m) return NaN;
  const whole = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]) / 1000;
  // The fraction is read as digits so 100 ns resolution survives.
  const frac = m[7] ? Number(`0.${m[7]}`) : 0;
  return whole + frac;
}

/**
 * Parses the CSV text into rows [{t, contextTokens, generatedTokens}] with t
 * in seconds from the first row, sorted by t. Throws naming the line on a
 * malformed row. Column order comes from the header.
 */
export function parseTrace(text, name = 'trace') {
  const lines = text.split(/\r?\n/);
  const header = (lines[0] ?? '').split(',').map((h) => h.trim());
  const col = (n) => header.indexOf(n);
  const iT = col('TIMESTAMP');
  const iC = col('ContextTokens');
  const iG = col('GeneratedTokens');
  if (iT < 0 || iC < 0 || iG < 0) {
    throw new Error(`${name}: header must name TIMESTAMP, ContextTokens and GeneratedTokens; got "${lines[0]}"`);
  }
  const rows = [];
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i].trim();
    if (!line) continue;
    const cells = line.split(',');
    const t = parseTimestamp(cells[iT] ?? '');
    const c = Number(cells[iC]);
    const g = Number(cells[iG]);
    if (!Number.isFinite(t) || !Number.isInteger(c) || !Number.isInteger(g) || c < 0 || g < 0) {
      throw new Error(`${name}:${i + 1}: malformed row "${line}"`);
    }
    rows.push({ t, contextTokens: c, generatedTokens: g });
  }
  if (!rows.length) throw new Error(`${name}: no rows`);
  rows.sort((a, b) => a.t - b.t);
  const t0 = rows[0].t;
  for (const r of rows) r.t -= t0;
  return rows;
}

export function loadTrace(file) {
  return parseTrace(fs.readFileSync(file, 'utf8'), file);
}

/**
 * Builds the replay schedule.
 *   rows         from parseTrace
 *   models       model names
 *   split        'split': row i goes to one model (seeded shuffle, so every
 *                model sees the same shape at 1/N of the rate); 'replicate':
 *                every model gets every row
 *   start, length  trace seconds to keep (length 0: to the end); the kept
 *                part is shifted to start at 0
 *   speedup      divides trace time
 *   maxTokens, maxPromptTokens  caps (0: none); generated tokens of 0 are
 *                sent as 1 (an OpenAI request cannot ask for none)
 * Returns [{seq, at (seconds from replay start), model, promptTokens,
 * maxTokens, traceTokens}] sorted by `at`.
 */
export function buildSchedule(rows, opts) {
  const { models, split = 'split', start = 0, length = 0, speedup = 1,
    maxTokens = 0, maxPromptTokens = 0, seed = 1 } = opts;
  if (!models.length) throw new Error('no models');
  if (!(speedup > 0)) throw new Error('speedup must be > 0');
  const kept = rows.filter((r) => r.t >= start && (length <= 0 || r.t < start + length));
  const base = kept.length ? kept[0].t : 0;
  const rand = mulberry32(seed);
  const out = [];
  for (const r of kept) {
    const targets = split === 'replicate' ? models : [models[Math.floor(rand() * models.length)]];
    for (const model of targets) {
      const gen = Math.max(1, r.generatedTokens);
      out.push({
        at: (r.t - base) / speedup,
        model,
        promptTokens: maxPromptTokens > 0 ? Math.min(r.contextTokens, maxPromptTokens) : r.contextTokens,
        maxTokens: maxTokens > 0 ? Math.min(gen, maxTokens) : gen,
        traceTokens: r.generatedTokens,
      });
    }
  }
  out.sort((a, b) => a.at - b.at);
  out.forEach((e, i) => { e.seq = i; });
  return out;
}

/** Small seeded PRNG: the same trace and seed give the same run. */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
