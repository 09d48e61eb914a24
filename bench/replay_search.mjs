// How far joint tuning of thaw's knobs gets on the four Azure cells: a
// random search over 14 knobs at once, or a local search from a setting.
// replay_grid.mjs tries every combination of a few values of six knobs; this
// samples the whole space (each knob kept at its default or drawn uniformly
// from a range around it) and prints every setting's verdicts, from which
// the wins and the closest settings per cell can be read off.
//
//   node bench/replay_search.mjs random N [SEED]     # N random settings
//   node bench/replay_search.mjs climb N SEED 'k=v,...'  # N steps from a setting
//
// Prints one line per setting tried (random) or per improvement (climb): the
// Azure cells it wins, the setting, and every cell's verdict as thaw-replay
// prints it. A climb scores a setting by the cells it wins (100 each) plus
// its shortfalls (requests short / 10 and % GPU-s over, against each
// baseline), so it moves towards the nearest win. tokens_per_request stays
// at its prior: fitting it to a trace's own mean would be knowing the trace.
//
// Environment: THAW_BUILD_DIR (default <repo>/build), THAW_TRACE_DIR (default
// <repo>/../shared/traces). Bounded: N replays of both Azure traces, about
// 0.4 s each, one at a time; each has a 120 s timeout.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { mulberry32 } from '../scripts/demo/trace.mjs';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const build = path.resolve(process.env.THAW_BUILD_DIR || path.join(repo, 'build'));
const bin = path.join(build, 'bench', 'replay', 'thaw-replay');
const traces = path.resolve(process.env.THAW_TRACE_DIR || path.join(repo, '..', 'shared', 'traces'));

// name: [low, high, default, integer]; the defaults are scaler/policy.c's.
const KNOBS = {
  target_utilisation: [0.8, 0.95, 0.88, false],
  scale_down_window_s: [45, 240, 90, true],
  trend_window_s: [120, 315, 240, true],
  queue_window_s: [20, 90, 45, true],
  keep_warm_cost: [0.5, 1.5, 1, false],
  surge_hold_s: [0, 45, 20, true],
  drain_time_factor: [0.2, 0.6, 0.33, false],
  wake_backlog_share: [0.3, 1.1, 0.75, false],
  staffing_beta: [0.8, 1.7, 1.25, false],
  wake_request_cost: [0.4, 1.3, 0.75, false],
  burst_cv: [0.7, 1.5, 1, false],
  bursty_utilisation: [0.8, 1, 0.92, false],
  bursty_scale_down_window_s: [90, 300, 180, true],
  panic_window_s: [2, 8, 3, true],
};

const defaults = () => Object.fromEntries(Object.entries(KNOBS).map(([k, v]) => [k, v[2]]));
const clamp = (k, v) => Math.min(KNOBS[k][1], Math.max(KNOBS[k][0], v));
const shown = (k, v) => (KNOBS[k][3] ? Math.round(v) : Math.round(v * 1000) / 1000);
const spec = (s) => Object.keys(s).filter((k) => shown(k, s[k]) !== KNOBS[k][2])
  .map((k) => `${k}=${shown(k, s[k])}`).join(',');

function parse(text) {
  const s = defaults();
  for (const item of text.split(',').map((x) => x.trim()).filter(Boolean)) {
    const parts = item.split('=').map((x) => x.trim());
    if (parts.length !== 2 || !(parts[0] in KNOBS) || parts[1] === '' || !Number.isFinite(Number(parts[1])))
      fail(`bad knob '${item}' (name=number, names: ${Object.keys(KNOBS).join(', ')})`);
    s[parts[0]] = Number(parts[1]);
  }
  return s;
}

function fail(msg) {
  console.error(`replay_search: ${msg}`);
  process.exit(2);
}

// Replays both Azure traces; per cell the verdicts against KEDA and KPA.
function judge(s) {
  const knobs = spec(s);
  const out = execFileSync(bin, ['--trace-dir', traces, '--traces', 'azure-code,azure-conv',
    ...(knobs ? ['--thaw', knobs] : [])], { encoding: 'utf8', timeout: 120000 });
  const cells = [];
  for (const line of out.split('\n')) {
    const c = line.split('|').map((x) => x.trim());
    if (c.length !== 7 || !/^(yes|no)/.test(c[3])) continue;
    // The verdict is thaw-replay's own ("yes" against both); the printed
    // margins, rounded, only measure how far a lost cell is from a win.
    const won = c[3].startsWith('yes') && c[4].startsWith('yes');
    let shortfall = 0;
    for (const verdict of [c[3], c[4]]) {
      const m = /([+-]\d+) req, ([+-][\d.]+) % GPU-s/.exec(verdict);
      if (!m) {
        if (verdict.startsWith('yes')) continue;
        fail(`no margins in the verdict '${verdict}' of ${c[1]} ${c[2]}`);
      }
      shortfall += Math.min(0, Number(m[1]) / 10) + Math.min(0, -Number(m[2]));
    }
    cells.push({ cell: `${c[1]} ${c[2]}`, won, shortfall, text: `${c[3]} / ${c[4]}` });
  }
  if (cells.length !== 4) fail(`thaw-replay printed ${cells.length} Azure verdicts, not 4 (traces in ${traces}?)`);
  const wins = cells.filter((x) => x.won).length;
  return { wins, score: wins * 100 + cells.reduce((a, x) => a + x.shortfall, 0), cells };
}

const report = (tag, s, j) => console.log(`${tag} wins=${j.wins} [${spec(s)}] ` +
  j.cells.map((x) => `${x.cell}: ${x.won ? 'WON' : 'lost'} (${x.text})`).join('; '));

const USAGE = "usage: node bench/replay_search.mjs random N [SEED] | climb N SEED 'k=v,...'";
const args = process.argv.slice(2);
const [mode, nText, seedText, start] = args;
const n = Number(nText);
const seed = Number(seedText ?? 1);
if (!['random', 'climb'].includes(mode) || !(Number.isInteger(n) && n > 0 && n <= 100000) ||
    !(Number.isInteger(seed) && seed >= 0 && seed < 2 ** 32) ||
    args.length > (mode === 'climb' ? 4 : 3) || (mode === 'climb' && args.length !== 4))
  fail(USAGE + ' (N 1-100000, SEED an integer 0 to 2^32-1)');
if (!fs.existsSync(bin)) fail(`${bin} is not built (meson compile -C ${build}; or set THAW_BUILD_DIR)`);
const rand = mulberry32(seed); // seeded: a run repeats exactly
if (mode === 'random') {
  for (let i = 0; i < n; i++) {
    const s = defaults();
    for (const [k, [lo, hi]] of Object.entries(KNOBS))
      if (rand() >= 0.5) s[k] = lo + rand() * (hi - lo);
    report(`#${i}`, s, judge(s));
  }
} else {
  let cur = parse(start ?? '');
  let best = judge(cur);
  report('start', cur, best);
  const names = Object.keys(KNOBS);
  for (let i = 0; i < n; i++) {
    const s = { ...cur };
    const moves = [1, 1, 2, 3][Math.floor(rand() * 4)];
    for (let m = 0; m < moves; m++) {
      const k = names[Math.floor(rand() * names.length)];
      const [lo, hi] = KNOBS[k];
      const width = (hi - lo) * [0.05, 0.1, 0.2][Math.floor(rand() * 3)];
      s[k] = clamp(k, s[k] + (rand() * 2 - 1) * width);
    }
    const j = judge(s);
    if (j.score > best.score) {
      cur = s;
      best = j;
      report(`#${i}`, cur, best);
    }
  }
  report('end', cur, best);
}
