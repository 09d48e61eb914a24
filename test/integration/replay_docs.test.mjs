// The replay benchmark's published results are what the code produces now:
// thaw-replay's main table (seed 1, every trace and shape, both cold starts;
// about 2 s, 12 s under ASan) must equal the table under "### Results" in
// docs/scaling-policy.md, and the summary in BENCHMARKS.md ("Scaling policy
// replay") must carry the same GPU-s, SLO and verdicts. A change to the
// policy, the simulator or a benchmark default that moves a figure fails here
// until the docs are regenerated (bench/replay.sh prints the tables). Without
// the Azure traces (THAW_TRACE_DIR, default ../shared/traces) only the
// synthetic shapes' rows are checked, and the test names say so.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';

import { buildDir, repoRoot, tmpDir } from './lib/harness.mjs';

const run = promisify(execFile);
const HOW = 'regenerate with bench/replay.sh and update docs/scaling-policy.md ("### Results") and BENCHMARKS.md';

/** The table rows (lines starting with '|') of the first table at or after `from`. */
function tableAt(text, from) {
  const lines = text.slice(from).split('\n');
  const start = lines.findIndex((l) => l.startsWith('|'));
  assert.ok(start >= 0, 'a table follows');
  const rows = [];
  for (const l of lines.slice(start)) {
    if (!l.startsWith('|')) break;
    rows.push(l.trimEnd());
  }
  return { rows, end: from + lines.slice(0, start + rows.length).join('\n').length };
}

/** The main table and the verdict table after it. */
function twoTables(text, from) {
  const main = tableAt(text, from);
  const verdicts = tableAt(text, main.end);
  return { main: main.rows, verdicts: verdicts.rows };
}

// The Azure traces live next to the checkout (../shared/traces, as for
// bench/replay.sh); a clone without them still checks the synthetic shapes.
const traceDir = path.resolve(process.env.THAW_TRACE_DIR || path.join(repoRoot, '..', 'shared', 'traces'));
const AZURE = ['code', 'conv'];
const haveAzure = AZURE.every((n) => fs.existsSync(path.join(traceDir, `AzureLLMInferenceTrace_${n}.csv`)));
const TRACES = [...(haveAzure ? AZURE.map((n) => `azure-${n}`) : []), 'step', 'ramp', 'diurnal', 'onoff', 'idle'];
const NOTE = haveAzure ? '' : ` (no Azure traces in ${traceDir}: the synthetic shapes only)`;

/** Only the rows of the traces replayed (and the two header rows). */
const replayed = (rows) => rows.filter((r, i) => i < 2 || TRACES.includes(r.split('|')[1].trim().split(' ')[0]));

async function replay() {
  const dir = tmpDir('thaw-replay-docs-');
  const json = path.join(dir, 'replay.json');
  const bin = path.join(buildDir, 'bench', 'replay', 'thaw-replay');
  assert.ok(fs.existsSync(bin), `${bin} is built`);
  const { stdout } = await run(bin, ['--trace-dir', traceDir, '--traces', TRACES.join(','), '--json', json],
    { timeout: 120000, maxBuffer: 16 * 1024 * 1024 });
  const runs = JSON.parse(fs.readFileSync(json, 'utf8')).runs;
  fs.rmSync(dir, { recursive: true, force: true });
  return { stdout, runs };
}

// One run serves both tests (under ASan it takes about 12 s).
let once = null;
const replayOnce = () => (once ??= replay());

test(`docs/scaling-policy.md shows the table thaw-replay prints now${NOTE}`, async () => {
  const { stdout } = await replayOnce();
  const now = twoTables(stdout, 0);
  assert.equal(now.main.length, 2 + TRACES.length * 2 * 4,
    `thaw-replay printed its table: ${TRACES.length} traces x 2 cold starts x 4 autoscalers`);
  const doc = fs.readFileSync(path.join(repoRoot, 'docs', 'scaling-policy.md'), 'utf8');
  const at = doc.indexOf('### Results');
  assert.ok(at >= 0, 'docs/scaling-policy.md has "### Results"');
  const shown = twoTables(doc, at);
  assert.equal(shown.main.length, 2 + 7 * 2 * 4, 'the docs show every trace and shape');
  assert.deepEqual(replayed(shown.main), now.main, `the main table differs: ${HOW}`);
  assert.deepEqual(replayed(shown.verdicts), now.verdicts, `the verdict table differs: ${HOW}`);
});

test(`BENCHMARKS.md summarises the same run${NOTE}`, async () => {
  const { stdout, runs } = await replayOnce();
  const cells = new Map();
  for (const r of runs) {
    const key = `${r.trace} ${r.cold_start_s} s`;
    if (!cells.has(key)) cells.set(key, {});
    cells.get(key)[r.autoscaler] = r;
  }
  // The verdicts as thaw-replay judges them (its JSON keeps 6 digits, which
  // could turn an exact tie).
  const verdict = new Map();
  for (const row of twoTables(stdout, 0).verdicts.slice(2)) {
    const c = row.split('|').slice(1, -1).map((x) => x.trim());
    const keda = c[2].startsWith('yes'), kpa = c[3].startsWith('yes');
    verdict.set(`${c[0]} ${c[1]}`, keda && kpa ? '**yes**' : kpa ? 'KPA only' : keda ? 'KEDA only' : 'no');
  }
  const text = fs.readFileSync(path.join(repoRoot, 'BENCHMARKS.md'), 'utf8');
  const at = text.indexOf('## Scaling policy replay');
  assert.ok(at >= 0, 'BENCHMARKS.md has "## Scaling policy replay"');
  const all = tableAt(text, at).rows.slice(2);
  assert.equal(all.length, 7 * 2, `one row per cell: ${HOW}`);
  const body = all.filter((r) => TRACES.includes(r.split('|')[1].trim().split(' ')[0]));
  assert.equal(body.length, cells.size, `one row per cell replayed: ${HOW}`);
  // Figures as printed, to the precision printed (rounding of a value the
  // JSON keeps to 6 digits may differ by one in the last place).
  const near = (shown, value, places, what) => {
    const tol = 10 ** -places + 1e-9;
    assert.ok(Math.abs(Number(shown) - value) <= tol,
      `BENCHMARKS.md ${what}: ${shown}, the run ${value.toFixed(places + 2)}: ${HOW}`);
  };
  const sloPlaces = (x) => (x * 100 >= 99 ? 2 : 1);
  for (const row of body) {
    const c = row.split('|').slice(1, -1).map((x) => x.trim());
    const cell = cells.get(c[0]);
    assert.ok(cell, `BENCHMARKS.md row "${c[0]}" is a cell of the run`);
    const { thaw, 'keda-hpa': keda, 'knative-kpa': kpa, oracle } = cell;
    const m = /^(\d+) \(([\d.]+)\)$/.exec(c[1]);
    assert.ok(m, `BENCHMARKS.md "${c[0]}" thaw GPU-s (x oracle): "${c[1]}"`);
    near(m[1], thaw.gpu_s, 0, `"${c[0]}" thaw GPU-s`);
    near(m[2], thaw.gpu_s / oracle.gpu_s, 2, `"${c[0]}" x oracle`);
    near(c[2], thaw.slo_attainment * 100, sloPlaces(thaw.slo_attainment), `"${c[0]}" thaw SLO`);
    near(c[3], thaw.ttft_p99_s, 1, `"${c[0]}" thaw p99 TTFT`);
    for (const [i, b, name] of [[4, keda, 'keda-hpa'], [5, kpa, 'knative-kpa']]) {
      const [g, sl] = c[i].split(' / ');
      near(g, b.gpu_s, 0, `"${c[0]}" ${name} GPU-s`);
      near(sl, b.slo_attainment * 100, sloPlaces(b.slo_attainment), `"${c[0]}" ${name} SLO`);
    }
    assert.equal(c[6], verdict.get(c[0]), `BENCHMARKS.md "${c[0]}" verdict: ${HOW}`);
  }
});
