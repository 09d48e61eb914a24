// How far per-cell tuning gets: replays every trace and shape (seed 1, cold
// starts 30 s and 120 s) under a grid of thaw's policy knobs and, per cell,
// reports whether ANY setting in the grid dominates both baselines (at least
// their SLO attainment with fewer GPU-seconds), and the setting that comes
// closest. The defaults are one point of the grid; a cell no setting wins
// cannot be won by choosing defaults, only by changing the policy. Also
// prints the settings that win the most cells at once.
//
//   node bench/replay_grid.mjs
//
// Baselines (KEDA + HPA, Knative's KPA) run once in the same invocation, with
// the same simulator. Against one baseline a run's shortfall is the SLO points
// it misses + the % GPU-s it spends over it (0 when it dominates it); a run's
// shortfall is the larger of its two.
//
// Environment:
//   THAW_BUILD_DIR  build directory holding bench/replay/thaw-replay (default <repo>/build)
//   THAW_TRACE_DIR  traces (default <repo>/../shared/traces)
//   GRID_JOBS       parallel replays (default 2)
// Bounded: 972 replays of about 0.5 s each; every replay has a 300 s timeout
// and the whole grid 30 minutes. Verdicts use the JSON's 6-digit values, so
// an exact tie with a baseline may be judged unlike thaw-replay's own table.

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const build = path.resolve(process.env.THAW_BUILD_DIR || path.join(repo, 'build'));
const bin = path.join(build, 'bench', 'replay', 'thaw-replay');
const traces = path.resolve(process.env.THAW_TRACE_DIR || path.join(repo, '..', 'shared', 'traces'));
const jobs = Number(process.env.GRID_JOBS ?? 2);
if (!Number.isInteger(jobs) || jobs < 1 || jobs > 64) {
  console.error(`replay_grid: GRID_JOBS must be an integer 1..64, not ${process.env.GRID_JOBS}`);
  process.exit(2);
}
// The whole grid must finish in this long (about 4 minutes on 2 cores).
const DEADLINE_MS = 30 * 60 * 1000;

// The knobs that move the cost/SLO trade-off, each around its default.
const grid = {
  staffing_beta: [0.5, 1.25, 2],
  bursty_utilisation: [0.8, 0.92, 1],
  keep_warm_cost: [0, 0.5, 1, 2],
  wake_backlog_share: [0.5, 0.75, 1],
  scale_down_window_s: [60, 90, 240], // the steady window; the bursty one stays 180 s
  surge_hold_s: [10, 20, 60],
};
const defaults = 'staffing_beta=1.25,bursty_utilisation=0.92,keep_warm_cost=1,' +
  'wake_backlog_share=0.75,scale_down_window_s=90,surge_hold_s=20';

if (!fs.existsSync(bin)) {
  console.error(`replay_grid: ${bin} not found; build it: meson compile -C ${build} thaw-replay`);
  process.exit(2);
}
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'thaw-grid-'));
process.on('exit', () => fs.rmSync(tmp, { recursive: true, force: true }));

let seq = 0;
function replay(args) {
  const out = path.join(tmp, `r${seq++}.json`);
  return new Promise((resolve, reject) => {
    execFile(bin, ['--trace-dir', traces, '--seed', '1', '--json', out, ...args],
      { timeout: 300000, maxBuffer: 1 << 24 }, (err) => {
        if (err) return reject(new Error(`thaw-replay ${args.join(' ')}: ${err.message}`));
        try {
          const runs = JSON.parse(fs.readFileSync(out, 'utf8')).runs;
          fs.rmSync(out);
          resolve(runs);
        } catch (e) {
          reject(new Error(`thaw-replay ${args.join(' ')}: unreadable result: ${e.message}`));
        }
      });
  });
}

function settings() {
  let all = [[]];
  for (const [k, vs] of Object.entries(grid))
    all = all.flatMap((pre) => vs.map((v) => [...pre, `${k}=${v}`]));
  return all.map((kv) => kv.join(','));
}

const cellKey = (r) => `${r.trace}|${r.cold_start_s}`;
const base = new Map();
for (const r of await replay(['--policies', 'keda-hpa,knative-kpa']))
  base.set(`${cellKey(r)}|${r.autoscaler}`, r);

// Dominating a baseline: at least its SLO attainment with fewer GPU-seconds,
// judged against each baseline on its own (one cheap and one good baseline
// do not make a cheap and good target). The shortfall is the worse of the two.
function judge(r) {
  let wins = true, shortfall = 0;
  const need = [];
  for (const name of ['keda-hpa', 'knative-kpa']) {
    const b = base.get(`${cellKey(r)}|${name}`);
    const s = Math.max(0, b.slo_attainment - r.slo_attainment) * 100 +
      Math.max(0, r.gpu_s / b.gpu_s - 1) * 100;
    wins = wins && r.slo_attainment >= b.slo_attainment && r.gpu_s < b.gpu_s;
    shortfall = Math.max(shortfall, s);
    need.push(`${(b.slo_attainment * 100).toFixed(2)} < ${b.gpu_s.toFixed(0)}`);
  }
  return { wins, shortfall, need: need.join('; ') };
}

const todo = settings();
const best = new Map(); // cell -> {shortfall, setting, run}
const winners = new Map(); // cell -> settings that win it
const atDefault = new Map();
const cellsWon = new Map(); // setting -> cells it wins
let next = 0;
async function worker() {
  while (next < todo.length) {
    const setting = todo[next++];
    for (const r of await replay(['--policies', 'thaw', '--thaw', setting])) {
      const c = cellKey(r), j = judge(r);
      if (j.wins) {
        winners.set(c, (winners.get(c) ?? 0) + 1);
        cellsWon.set(setting, (cellsWon.get(setting) ?? 0) + 1);
      }
      const b = best.get(c);
      if (!b || j.shortfall < b.shortfall) best.set(c, { ...j, setting, run: r });
      if (setting === defaults) atDefault.set(c, j);
    }
  }
}
const t0 = Date.now();
const deadline = setTimeout(() => {
  console.error(`replay_grid: not done after ${DEADLINE_MS / 60000} minutes; stopping`);
  process.exit(3);
}, DEADLINE_MS);
try {
  await Promise.all(Array.from({ length: jobs }, worker));
} catch (e) {
  console.error(`replay_grid: ${e.message}`);
  process.exit(1); // a failed replay makes the table meaningless (the other replay ends in seconds)
}
clearTimeout(deadline);
if (!todo.includes(defaults) || atDefault.size === 0)
  throw new Error('replay_grid: the defaults are not a point of the grid');

console.log(`# Per-cell tuning: ${todo.length} settings of thaw's knobs, seed 1 ` +
  `(${((Date.now() - t0) / 1000).toFixed(0)} s)\n`);
console.log('Grid: ' + Object.entries(grid).map(([k, v]) => `${k} {${v.join(', ')}}`).join('; ') + '\n');
console.log('| trace | cold start | defaults win | settings that win | closest: SLO % | GPU-s | need per baseline (KEDA; KPA): SLO % < GPU-s | shortfall | closest setting |');
console.log('|---|---:|---|---:|---:|---:|---|---:|---|');
let won = 0, reachable = 0;
for (const [c, b] of [...best.entries()].sort()) {
  const [trace, cold] = c.split('|');
  const d = atDefault.get(c);
  won += d.wins ? 1 : 0;
  reachable += winners.get(c) ? 1 : 0;
  console.log(`| ${trace} | ${cold} s | ${d.wins ? 'yes' : 'no'} | ${winners.get(c) ?? 0} | ` +
    `${(b.run.slo_attainment * 100).toFixed(2)} | ${b.run.gpu_s.toFixed(0)} | ${b.need} | ` +
    `${b.shortfall.toFixed(2)} | ` +
    `\`${b.setting}\` |`);
}
console.log(`\ncells won by the defaults: ${won} of ${best.size}; ` +
  `won by at least one setting of the grid: ${reachable} of ${best.size}`);
const top = [...cellsWon.entries()].sort((a, b) => b[1] - a[1]).slice(0, 3);
console.log('settings winning the most cells at once: ' +
  top.map(([st, n]) => `${n} (\`${st}\`)`).join('; '));
