// The Grafana dashboard (manifests/monitoring/dashboards/thaw.json) against
// a real Prometheus:
//   - static checks of the JSON (ids, layout, datasource, variables,
//     annotation, the panels the issue asks for);
//   - a real prometheus with the project's recording and alerting rules
//     (manifests/prometheus/thaw-rules.yaml; group intervals shortened from
//     15 s to 1 s, expressions untouched) scrapes a real thaw-scaler (its
//     ConfigMap's config, so its token-rate query reads the recording rule),
//     a real thaw-activator (the example's model list, backends made local)
//     and two fake vLLM servers, under a little traffic: a warm model with a
//     steady load and a Redis stream of jobs, a cold model woken by held
//     requests, KEDA's calls made by the test with the example ScaledObjects'
//     metadata. Then every query of the dashboard, the template variables'
//     and the annotation's included, runs with the variables substituted as
//     Grafana would, and each must succeed and return data with a finite
//     value.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  binPath, freePort, grpcClient, spawnProcess, startPrometheus, startRedis, tmpDir, waitUntil,
} from './lib/harness.mjs';
import { complete, startFakeVllm } from './activator_lib.mjs';
import { buildKustomization, loadYamlDocs, manifestsDir } from './manifests_lib.mjs';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const dashboardFile = path.join(manifestsDir, 'monitoring', 'dashboards', 'thaw.json');
const dashboard = JSON.parse(fs.readFileSync(dashboardFile, 'utf8'));
const panels = dashboard.panels.filter((p) => p.type !== 'row');
const variables = Object.fromEntries(dashboard.templating.list.map((v) => [v.name, v]));

/** Every query of the dashboard: {where, expr, instant}. */
function dashboardQueries() {
  const out = [];
  for (const p of panels) {
    for (const t of p.targets) out.push({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr, instant: t.instant === true });
  }
  for (const a of dashboard.annotations.list.filter((x) => x.expr)) {
    out.push({ where: `annotation "${a.name}"`, expr: a.expr, instant: false });
  }
  return out;
}

test('dashboard JSON: panels have unique ids, fit the grid and do not overlap', () => {
  const ids = dashboard.panels.map((p) => p.id);
  assert.equal(new Set(ids).size, ids.length, 'duplicate panel ids');
  const cells = new Map();
  for (const p of dashboard.panels) {
    const g = p.gridPos;
    assert.ok(g.x >= 0 && g.w > 0 && g.x + g.w <= 24 && g.h > 0, `panel "${p.title}" gridPos ${JSON.stringify(g)}`);
    for (let x = g.x; x < g.x + g.w; x++) {
      for (let y = g.y; y < g.y + g.h; y++) {
        const k = `${x},${y}`;
        assert.ok(!cells.has(k), `panels "${cells.get(k)}" and "${p.title}" overlap at ${k}`);
        cells.set(k, p.title);
      }
    }
  }
});

test('dashboard JSON: every panel queries the selected Prometheus; refIds are unique', () => {
  for (const p of panels) {
    assert.ok(p.title && p.targets?.length > 0, `panel ${p.id} has a title and queries`);
    assert.deepEqual(p.datasource, { type: 'prometheus', uid: '${datasource}' }, `panel "${p.title}" datasource`);
    const refs = p.targets.map((t) => t.refId);
    assert.equal(new Set(refs).size, refs.length, `panel "${p.title}" refIds`);
    for (const t of p.targets) {
      assert.ok(typeof t.expr === 'string' && t.expr.length > 0, `panel "${p.title}" ${t.refId} expr`);
      assert.deepEqual(t.datasource, p.datasource);
    }
  }
});

test('dashboard JSON: template variables for datasource, namespace and model; decision changes as annotations', () => {
  assert.equal(variables.datasource?.type, 'datasource');
  assert.equal(variables.datasource.query, 'prometheus');
  for (const v of ['namespace', 'model']) {
    assert.equal(variables[v]?.type, 'query', `variable ${v}`);
    assert.ok(variables[v].multi && variables[v].includeAll, `variable ${v} allows several values`);
    assert.match(variables[v].query.query, /^label_values\(/);
  }
  assert.match(variables.model.query.query, /\$namespace/, 'the model list follows the namespace');
  const ann = dashboard.annotations.list.find((a) => a.name === 'Decision changes');
  assert.ok(ann && ann.enable, 'decision-change annotation');
  assert.match(ann.expr, /thaw_scaler_decision_info/);
  assert.match(ann.expr, /thaw_scaler_last_decision_change_seconds/);
  assert.match(ann.textFormat, /\{\{reason\}\}/);
  // Per-model panels follow the model variable.
  const perModel = panels.filter((p) => !/^(Sources|Source|gRPC|Activator Redis|Connections)/.test(p.title));
  for (const p of perModel) {
    assert.ok(p.targets.some((t) => t.expr.includes('$model')), `panel "${p.title}" ignores $model`);
  }
});

test('dashboard JSON: the panels the issue asks for are there', () => {
  const titles = panels.map((p) => p.title);
  for (const want of [/tokens\/s/, /Requests\/s/, /Desired vs ready/, /Active/, /Held, queued and in-flight requests/, /Hold time/,
    /^Cold starts$/, /Decisions by direction and reason/, /^Sources$/, /Source staleness/, /Outcomes/,
    /Proxy latency/, /gRPC latency/, /Wakes/, /Last decision/]) {
    assert.ok(titles.some((t) => want.test(t)), `no panel matching ${want}; have ${titles.join(' | ')}`);
  }
  const hold = panels.find((p) => p.title === 'Hold time');
  assert.deepEqual(hold.targets.map((t) => t.legendFormat), ['{{model}} p50', '{{model}} p99']);
});

// ---------------------------------------------------------------------------
// Live: every query against a real Prometheus.

const example = buildKustomization(path.join(manifestsDir, 'examples', 'llama'));
const exampleObj = (kind, name) => example.find((o) => o.kind === kind && o.metadata.name === name);

let redis;
let prom;
let scaler;
let activator;
let client;
let vllm;
let qwen;
let stopTraffic = false;
const background = [];

before(async () => {
  const dir = tmpDir('thaw-dash-');
  redis = await startRedis();
  prom = await startPrometheus({ scrapeTargets: [], scrapeInterval: '1s' });

  const llamaPort = await freePort();
  const qwenPort = await freePort();
  vllm = await startFakeVllm({ model: 'llama-8b', port: llamaPort, tokensPerSecond: 100, maxBatch: 64, ttftMs: 5, waitReady: true });

  // thaw-scaler: the shipped config; only addresses and the query interval
  // (5 s shipped) are changed, by flags, which beat the config file.
  const scalerCfg = path.join(dir, 'scaler.json');
  fs.writeFileSync(scalerCfg, exampleObj('ConfigMap', 'thaw-scaler').data['scaler.json']);
  scaler = await spawnProcess(binPath('thaw-scaler'), ['--config', scalerCfg, '--listen', '127.0.0.1:0',
    '--http-listen', '127.0.0.1:0', '--prometheus-url', prom.url, '--redis-url', redis.url,
    '--prometheus-interval-ms', '1000'], {
    name: 'thaw-scaler', readyLogRegex: /event=listening grpc_port=\d+/, timeoutMs: 15000,
  });
  const sm = await scaler.waitForLog(/event=listening grpc_port=(\d+) http_port=(\d+)/);
  client = grpcClient(`127.0.0.1:${sm[1]}`);

  // thaw-activator: the example's model list with local backends.
  const actCfg = JSON.parse(exampleObj('ConfigMap', 'thaw-activator').data['activator.json']);
  const ports = { 'llama-8b': llamaPort, 'qwen-7b': qwenPort };
  for (const m of actCfg.models) m.backend = `http://127.0.0.1:${ports[m.name]}`;
  const actPath = path.join(dir, 'activator.json');
  fs.writeFileSync(actPath, JSON.stringify(actCfg));
  activator = await spawnProcess(binPath('thaw-activator'), ['--config', actPath, '--listen', '127.0.0.1:0',
    '--admin-listen', '127.0.0.1:0', '--redis-url', redis.url, '--instance-id', 'dash-test'], {
    name: 'thaw-activator', readyLogRegex: /event=listening/, timeoutMs: 15000,
  });
  const am = await activator.waitForLog(/event=listening proxy_port=(\d+) admin_port=(\d+)/);
  activator.port = Number(am[1]);

  // Prometheus as prometheus-operator would set it up: vLLM pods labelled
  // with their namespace, the scaler scraped with honor_labels (its series
  // carry the ScaledObject's namespace), the project's rules loaded.
  const rules = fs.readFileSync(path.join(manifestsDir, 'prometheus', 'thaw-rules.yaml'), 'utf8');
  assert.match(rules, /interval: 15s/);
  fs.writeFileSync(path.join(prom.dir, 'thaw-rules.yaml'), rules.replaceAll('interval: 15s', 'interval: 1s'));
  fs.writeFileSync(path.join(prom.dir, 'prometheus.yml'), [
    'global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}',
    'rule_files: [thaw-rules.yaml]',
    'scrape_configs:',
    '  - job_name: vllm',
    `    static_configs: [{targets: ['127.0.0.1:${llamaPort}', '127.0.0.1:${qwenPort}'], labels: {namespace: models}}]`,
    '  - job_name: thaw-scaler',
    '    honor_labels: true',
    `    static_configs: [{targets: ['127.0.0.1:${sm[2]}'], labels: {namespace: thaw-system}}]`,
    '  - job_name: thaw-activator',
    `    static_configs: [{targets: ['127.0.0.1:${am[2]}'], labels: {namespace: thaw-system}}]`,
    '',
  ].join('\n'));
  const res = await fetch(`${prom.url}/-/reload`, { method: 'POST' });
  assert.equal(res.status, 200, await res.text());
  const rulesApi = await (await fetch(`${prom.url}/api/v1/rules`)).json();
  assert.equal(rulesApi.data.groups.length, 4, 'the rule groups are loaded');
  // New targets reach the scrape loop only at the next discovery update (up
  // to 5 s): wait for the scrapes before making anything happen.
  await waitUntil(async () => {
    const r = await (await fetch(`${prom.url}/api/v1/query?query=${encodeURIComponent('up == 1')}`)).json();
    return new Set(r.data.result.map((x) => x.metric.job)).size === 3;
  }, 20000, { what: 'prometheus scraping vllm, thaw-scaler and thaw-activator' });

  // A Redis stream of batch jobs for llama-8b, as its ScaledObject describes.
  const llamaMeta = exampleObj('ScaledObject', 'llama-8b').spec.triggers[0].metadata;
  await redis.cli('XGROUP', 'CREATE', llamaMeta.redisKey, llamaMeta.redisStreamGroup, '$', 'MKSTREAM');
  for (let i = 0; i < 5; i++) await redis.cli('XADD', llamaMeta.redisKey, '*', 'job', String(i));

  // KEDA: StreamIsActive for the external-push trigger, and every half second
  // GetMetricSpec, GetMetrics and IsActive for both ScaledObjects.
  const refs = ['llama-8b', 'qwen-7b'].map((n) => {
    const so = exampleObj('ScaledObject', n);
    return { name: n, namespace: so.metadata.namespace, scalerMetadata: so.spec.triggers[0].metadata };
  });
  const stream = client.streamIsActive(refs[0]);
  background.push((async () => {
    while (!stopTraffic) {
      for (const ref of refs) {
        await client.getMetricSpec(ref).catch(() => {});
        await client.getMetrics({ scaledObjectRef: ref, metricName: `thaw-${ref.scalerMetadata.model}` }).catch(() => {});
        await client.isActive(ref).catch(() => {});
      }
      await sleep(500);
    }
    stream.cancel();
  })());
  // A ScaledObject with a broken value: the gRPC panels see a non-OK code.
  await client.getMetricSpec({ ...refs[0], scalerMetadata: { ...refs[0].scalerMetadata, targetQueueLength: 'many' } })
    .catch(() => {});

  // A steady load on the warm model (streamed and not), one unknown model.
  for (let w = 0; w < 3; w++) {
    background.push((async () => {
      for (let i = 0; !stopTraffic; i++) {
        await complete(activator.port, 'llama-8b', { maxTokens: 12, stream: i % 2 === 1 }).catch(() => {});
      }
    })());
  }
  await complete(activator.port, 'no-such-model').catch(() => {});

  // The cold model: requests are held, the activator publishes a wake; the
  // "pod" comes up two seconds later and loads for another second and a half.
  const held = [1, 2, 3].map(() => complete(activator.port, 'qwen-7b', { maxTokens: 8, timeoutMs: 30000 }));
  await sleep(2000);
  qwen = await startFakeVllm({ model: 'qwen-7b', port: qwenPort, tokensPerSecond: 100, loadDelayMs: 1500, ttftMs: 5 });
  const answers = await Promise.all(held);
  for (const a of answers) assert.equal(a.status, 200, 'held requests are answered once the model is ready');
  assert.ok(answers.every((a) => a.headers['x-thaw-cold-start-ms'] !== undefined), 'held requests were held');
});

// A last resort if a test failed early; the last test stops everything in
// order (the harness's own cleanup would stop the processes under traffic).
after(() => { stopTraffic = true; });

async function promGet(pathAndQuery) {
  const res = await fetch(`${prom.url}${pathAndQuery}`);
  const body = await res.json();
  if (body.status !== 'success') throw new Error(`${pathAndQuery}: ${body.errorType}: ${body.error}`);
  return body.data;
}

// Grafana's label_values(selector, label) variable query.
async function labelValues(query) {
  const m = /^label_values\((.*),\s*([a-zA-Z_]+)\)$/.exec(query);
  assert.ok(m, `unsupported variable query ${query}`);
  return promGet(`/api/v1/label/${m[2]}/values?${new URLSearchParams({ 'match[]': m[1] })}`);
}

// A multi-value selection as Grafana writes it into a Prometheus regex.
const regexOf = (values) => (values.length === 1 ? values[0] : `(${values.join('|')})`);

function substitute(expr, vars) {
  let out = expr;
  for (const [k, v] of Object.entries(vars)) out = out.split(`\${${k}}`).join(v).split(`$${k}`).join(v);
  assert.ok(!out.includes('$'), `unsubstituted variable in ${out}`);
  return out;
}

const finite = (v) => Number.isFinite(Number(v));
const hasData = (data) => data.result.some((s) =>
  (s.values ? s.values.some(([, v]) => finite(v)) : finite(s.value[1])));

test('live: every dashboard query returns data from a real Prometheus', async (t) => {
  const started = Date.now();
  const windowStart = started / 1000 - 120;

  // Template variables first, in order, as Grafana resolves them.
  const vars = {};
  const nsValues = await waitFor(() => labelValues(variables.namespace.query.query), (v) => v.includes('models'), 'namespace values');
  assert.deepEqual(nsValues, ['models'], 'ScaledObject namespaces (not the scaler\'s own)');
  vars.namespace = regexOf(nsValues);
  const modelValues = await waitFor(() => labelValues(substitute(variables.model.query.query, vars)),
    (v) => v.length === 2, 'model values');
  assert.deepEqual(modelValues, ['llama-8b', 'qwen-7b']);
  vars.model = regexOf(modelValues);

  const queries = dashboardQueries();
  t.diagnostic(`${queries.length} queries, namespace=${vars.namespace} model=${vars.model}`);
  const pending = new Map(queries.map((q) => [q.where, q]));
  const last = new Map();
  const deadline = Date.now() + 60000;
  while (pending.size > 0 && Date.now() < deadline) {
    const now = Date.now() / 1000;
    const builtins = {
      __rate_interval: '10s', __interval: '1s', __range: `${Math.ceil(now - windowStart)}s`,
    };
    for (const [where, q] of pending) {
      const expr = substitute(q.expr, { ...vars, ...builtins });
      // A query Prometheus refuses fails at once: it would never improve.
      const data = q.instant
        ? await promGet(`/api/v1/query?${new URLSearchParams({ query: expr, time: String(now) })}`)
        : await promGet(`/api/v1/query_range?${new URLSearchParams({ query: expr, start: String(windowStart), end: String(now), step: '1' })}`);
      last.set(where, { expr, result: data.result });
      if (hasData(data)) pending.delete(where);
    }
    if (pending.size > 0) await sleep(1000);
  }
  t.diagnostic(`all queries had data after ${((Date.now() - started) / 1000).toFixed(1)} s`);
  const summary = (result) => (result ?? []).map((r) => `${JSON.stringify(r.metric)}: ${
    r.values ? `${r.values.length} points, last ${r.values.at(-1)?.[1]}` : r.value[1]}`).join('; ') || 'no series';
  const missing = [...pending.keys()].map((w) => `${w}: ${last.get(w)?.expr} -> ${summary(last.get(w)?.result)}`);
  assert.deepEqual(missing, [], 'queries without data');

  // The scaler's token-rate query (through the recording rule) saw the
  // warm model's tokens, and KEDA was told to keep it up.
  // The rate needs two scrapes of the model's counters first: wait for it
  // (every other query may have had data long before).
  await waitFor(() => promGet(`/api/v1/query?${new URLSearchParams({ query: 'model:thaw_scaler_input_token_rate:max{model="llama-8b"}' })}`),
    (rate) => Number(rate.result[0]?.value[1]) > 0, 'token rate seen by the scaler');
  const desired = await promGet(`/api/v1/query?${new URLSearchParams({ query: 'namespace_model:thaw_scaler_desired_replicas:max{namespace="models"}' })}`);
  const byModel = Object.fromEntries(desired.result.map((s) => [s.metric.model, Number(s.value[1])]));
  assert.ok(byModel['llama-8b'] >= 1, `desired replicas ${JSON.stringify(byModel)}`);
});


async function waitFor(fn, pred, what, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let v;
  for (;;) {
    v = await fn();
    if (pred(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: last ${JSON.stringify(v)}`);
    await sleep(500);
  }
}

// Keep the plain rules file loadable as the test loads it.
test('the rules file the test loads is the shipped one', () => {
  const plain = loadYamlDocs(path.join(manifestsDir, 'prometheus', 'thaw-rules.yaml'))[0];
  assert.equal(plain.groups.length, 4);
});

test('thaw-activator and thaw-scaler exit 0 once the traffic stops', async () => {
  stopTraffic = true;
  await Promise.all(background);
  client?.close();
  assert.equal(await activator.stop('SIGTERM', 15000), 0, 'thaw-activator exits 0');
  assert.equal(await scaler.stop('SIGTERM', 10000), 0, 'thaw-scaler exits 0');
});
