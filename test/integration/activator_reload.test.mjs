// thaw-activator config reloads that remove and re-add models while they carry
// requests, against a real Redis: one thaw:held field per name (the sum of
// the configured model and its removed namesakes), fields deleted even when
// Redis was away at the time, outcome counts kept per name without a series
// for names that never served, and wakeWith models added by the same reload.
import net from 'node:net';
import { after, before, test } from 'node:test';

import {
  assert, assertAccounted, complete, fillSlotAndQueue, freePort, metricSum, sleep, startActivator, startFakeVllm,
  waitUntil,
} from './activator_lib.mjs';
import { startRedis } from './lib/harness.mjs';

let redis;
before(async () => { redis = await startRedis(); });
after(async () => { await redis?.stop(); });

const modelCfg = (name, port, extra = {}) => (
  { name, backend: `http://127.0.0.1:${port}`, probeInitialMs: 5, probeMaxMs: 20, ...extra });

/** Caught: a failing assertion stops the activator under pending requests. */
const settle = (p) => p.catch((e) => ({ status: `error ${e.message}` }));

async function reload(act, cfg) {
  const since = act.proc.mark();
  act.writeConfig(cfg);
  act.proc.proc.kill('SIGHUP');
  await act.proc.waitForLog(/event=config_reloaded/, 20000, { since });
}

/** Series of /metrics that appear more than once (same name and labels). */
function duplicateSeries(text) {
  const seen = new Map();
  for (const l of text.split('\n')) {
    if (!l || l.startsWith('#')) continue;
    const k = l.slice(0, l.lastIndexOf(' '));
    seen.set(k, (seen.get(k) ?? 0) + 1);
  }
  return [...seen].filter(([, n]) => n > 1).map(([k]) => k);
}

test('a removed model and its re-added namesake share one thaw:held field: their sum, never deleted while either holds', async () => {
  const [deadPort, keepPort] = [await freePort(), await freePort()];
  const keep = modelCfg('rk', keepPort);
  const act = await startActivator({ models: [keep, modelCfg('rx', deadPort, { holdTimeoutSeconds: 5 })] },
    { redisUrl: redis.url, instanceId: 'act-share' });
  const field = async () => (await redis.cli('HGET', 'thaw:held:rx', 'act-share')) || null;
  try {
    const old = settle(complete(act.port, 'rx', { timeoutMs: 20000 }));
    await waitUntil(async () => (await field())?.startsWith('1:'), 3000, { what: 'held 1' });
    await reload(act, { models: [keep] });
    // Removed but still holding: still seen in /metrics and /models, as in Redis.
    assert.equal(metricSum(await act.metrics(), 'thaw_activator_held_requests', { model: 'rx' }), 1);
    assert.deepEqual((await act.models()).removedModels.map((m) => [m.name, m.held]), [['rx', 1]]);
    await reload(act, { models: [keep, modelCfg('rx', deadPort, { holdTimeoutSeconds: 12 })] });
    const fresh = Array.from({ length: 3 }, () => settle(complete(act.port, 'rx', { timeoutMs: 20000 })));
    // The removed instance's 1 and the new one's 3, from the next refresh on.
    await waitUntil(async () => (await field())?.startsWith('4:'), 3000, { what: 'held 4 (1 + 3)' });
    // One series for the name, the sum (as the field).
    const text = await (await fetch(`http://127.0.0.1:${act.adminPort}/metrics`)).text();
    assert.deepEqual(text.split('\n').filter((l) => l.startsWith('thaw_activator_held_requests{model="rx"}')),
      ['thaw_activator_held_requests{model="rx"} 4']);
    assert.equal((await act.model('rx')).held, 3, 'the configured instance in /models');
    await sleep(1200);
    assert.match(await field(), /^4:/, 'the sum stays');
    // The removed one's hold times out: the field goes to 3, not away.
    assert.equal((await old).status, 504);
    await waitUntil(async () => (await field())?.startsWith('3:'), 2000, { what: 'held 3' });
    await act.proc.waitForLog(/event=model_removed model=rx/, 3000);
    assert.match(await field(), /^3:/, 'not deleted while the live model holds');
    for (const r of await Promise.all(fresh)) assert.equal(r.status, 504);
    await waitUntil(async () => (await field()) === null, 3000, { what: 'deleted once nothing is held' });
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

test('remove, re-add, remove, re-add while each instance carries a request: one series per name, counts kept', async () => {
  const [deadPort, keepPort] = [await freePort(), await freePort()];
  const withX = { models: [modelCfg('rk', keepPort), modelCfg('rx', deadPort, { holdTimeoutSeconds: 10 })] };
  const withoutX = { models: [modelCfg('rk', keepPort)] };
  const act = await startActivator(withX, { redisUrl: redis.url, instanceId: 'act-acc' });
  const hold = async () => {
    const p = settle(complete(act.port, 'rx', { timeoutMs: 20000 }));
    await waitUntil(async () => (await act.model('rx'))?.held === 1, 3000, { what: 'held' });
    return p;
  };
  const noDuplicates = async (what) => assert.deepEqual(duplicateSeries(await act.metricsText()), [], what);
  const timeouts = async () => metricSum(await act.metrics(), 'thaw_activator_requests_total',
    { model: 'rx', outcome: 'hold_timeout' });
  try {
    const a = await hold();
    await reload(act, withoutX);
    await reload(act, withX);
    const b = await hold();
    await reload(act, withoutX);
    await noDuplicates('two removed instances of rx');
    await reload(act, withX);
    const c = await hold();
    await noDuplicates('two removed instances and the configured one');
    for (const r of await Promise.all([a, b, c])) assert.equal(r.status, 504);
    await assertAccounted(act);
    assert.equal(await timeouts(), 3);
    await reload(act, withoutX);
    await noDuplicates('rx removed, idle');
    assert.equal(await timeouts(), 3);
    await reload(act, withX);
    await reload(act, withoutX);
    await reload(act, withX);
    assert.equal(await timeouts(), 3);
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

test('models removed without ever serving leave no series behind; a served one keeps its counts', async () => {
  const deadPort = await freePort();
  const base = [modelCfg('keep', deadPort, { holdTimeoutSeconds: 1 })];
  const act = await startActivator({ models: base });
  try {
    await reload(act, { models: [...base, ...Array.from({ length: 2000 }, (_, i) => modelCfg(`d${i}`, deadPort))] });
    await reload(act, { models: base });
    const series = (await act.metricsText()).split('\n').filter((l) => /^thaw_activator_requests_total\{model="d\d+"/.test(l));
    assert.deepEqual(series, []);
    await reload(act, { models: [...base, modelCfg('served', deadPort, { holdTimeoutSeconds: 1 })] });
    assert.equal((await complete(act.port, 'served', { timeoutMs: 10000 })).status, 504);
    await reload(act, { models: base });
    await act.proc.waitForLog(/event=model_removed model=served/, 3000);
    assert.equal(metricSum(await act.metrics(), 'thaw_activator_requests_total',
      { model: 'served', outcome: 'hold_timeout' }), 1);
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

/** A TCP proxy to Redis that can be cut (every connection closed, no listener) and reopened. */
function tcpProxy(targetPort) {
  const socks = new Set();
  let server = null;
  const p = {
    port: 0,
    async open() {
      server = net.createServer((c) => {
        const u = net.connect(targetPort, '127.0.0.1');
        socks.add(c);
        socks.add(u);
        c.pipe(u);
        u.pipe(c);
        const end = () => { c.destroy(); u.destroy(); socks.delete(c); socks.delete(u); };
        for (const s of [c, u]) { s.on('error', end); s.on('close', end); }
      });
      await new Promise((r) => server.listen(p.port, '127.0.0.1', r));
      p.port = server.address().port;
    },
    async cut() {
      for (const s of socks) s.destroy();
      socks.clear();
      if (server?.listening) await new Promise((r) => server.close(r));
    },
  };
  return p;
}

test('a removed model freed while Redis is unreachable: its thaw:held field is deleted once Redis is back', async () => {
  const deadPort = await freePort();
  const proxy = tcpProxy(redis.port);
  await proxy.open();
  const base = [modelCfg('keep', deadPort)];
  const act = await startActivator({ models: [...base, modelCfg('rs', deadPort, { holdTimeoutSeconds: 3 })] },
    { redisUrl: `redis://127.0.0.1:${proxy.port}`, instanceId: 'act-stale' });
  const field = async () => (await redis.cli('HGET', 'thaw:held:rs', 'act-stale')) || null;
  try {
    const held = settle(complete(act.port, 'rs', { timeoutMs: 20000 }));
    await waitUntil(async () => (await field())?.startsWith('1:'), 3000, { what: 'held 1' });
    const since = act.proc.mark();
    await reload(act, { models: base });
    await proxy.cut();
    await act.proc.waitForLog(/event=redis_down/, 3000, { since });
    assert.equal((await held).status, 504);
    await act.proc.waitForLog(/event=model_removed model=rs/, 3000, { since });
    assert.match(await field(), /^1:/, 'left while Redis was away');
    const back = act.proc.mark();
    await proxy.open();
    await act.proc.waitForLog(/event=redis_up/, 8000, { since: back });
    await waitUntil(async () => (await field()) === null, 3000, { what: 'deleted once Redis is back' });
  } finally {
    await act.stop();
    await proxy.cut();
  }
});

/**
 * Model wa (maxConcurrencyPerEndpoint 1, its wakeWith in `wakeWith`) is
 * ready among `others`, with one streaming request on its one slot and one
 * queued behind it. A reload moves wa to a backend that is not up, with
 * `reloadedOthers` beside it; check(act, since) looks at what the reload
 * did. Then wa's new backend comes up and both requests must get their
 * answer.
 */
async function reloadQueuedToDeadBackend({ wakeWith, others, reloadedOthers, instanceId, check }) {
  const aPort = await freePort();
  const fa = await startFakeVllm({ model: 'wa', port: aPort, waitReady: true, tokensPerSecond: 20 });
  const [deadPort, bPort] = [await freePort(), await freePort()];
  const wa = (port, ww) => modelCfg('wa', port, { maxConcurrencyPerEndpoint: 1, ...(ww ? { wakeWith: ww } : {}) });
  const limits = { drainTimeoutSeconds: 2 };
  const act = await startActivator({ limits, models: [wa(aPort, wakeWith.before), ...others(bPort)] },
    { redisUrl: redis.url, instanceId });
  let fa2 = null;
  try {
    assert.equal((await complete(act.port, 'wa')).status, 200);
    const { streaming, queued } = await fillSlotAndQueue(act, 'wa');
    const since = act.proc.mark();
    const models = [wa(deadPort, wakeWith.after), ...reloadedOthers(bPort)];
    act.writeConfig({ limits, models });
    act.proc.proc.kill('SIGHUP');
    await act.proc.waitForLog(new RegExp(`event=config_reloaded models=${models.length}`), 3000, { since });
    await check(act, since);
    // The queued request waits for wa's new backend: it comes up.
    fa2 = await startFakeVllm({ model: 'wa', port: deadPort });
    assert.equal((await streaming).status, 200);
    assert.equal((await queued).status, 200);
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fa.stop();
    await fa2?.stop();
  }
}

test('a reload that moves a ready model with queued requests to a dead backend wakes its wakeWith model, looked up by name', async () => {
  // wb and wx swap places: wb's index in the new config is wx's in the
  // model set the reload replaces. wa's endpoints all go while it has a
  // request queued: it wakes again, and with it wb (waking already since
  // wa's first wake), never wx.
  await reloadQueuedToDeadBackend({
    wakeWith: { before: ['wb'], after: ['wb'] },
    others: (port) => [modelCfg('wx', port), modelCfg('wb', port)],
    reloadedOthers: (port) => [modelCfg('wb', port), modelCfg('wx', port)],
    check: async (act, since) => {
      await act.proc.waitForLog(/event=model_state model=wa from=ready to=waking event=endpoints_gone/, 3000, { since });
      await sleep(200);
      assert.equal((await act.model('wx')).state, 'cold', 'wx woken in wb\'s place');
      assert.equal((await act.model('wb')).state, 'waking');
    },
  });
});

test('a reload that adds wb and moves wa (wakeWith [wb], a request queued) to a dead backend wakes wb', async () => {
  await reloadQueuedToDeadBackend({
    wakeWith: { before: null, after: ['wb'] },
    others: () => [],
    reloadedOthers: (port) => [modelCfg('wb', port)],
    instanceId: 'act-ww',
    check: async (act, since) => {
      await act.proc.waitForLog(/event=model_state model=wa from=ready to=waking/, 3000, { since });
      await act.proc.waitForLog(/event=model_state model=wb from=cold to=waking event=wake/, 2000, { since });
    },
  });
});

// The hold queue looks at each tier's head for deadlines: a reload that
// shortened holdTimeoutSeconds used to leave a request held after it waiting
// behind an older one with the old, longer deadline (20 s instead of 1 s).
test('a reload that shortens holdTimeoutSeconds applies to the requests held before it and after it', async () => {
  const port = await freePort(); // nothing there: the model stays cold
  const act = await startActivator({ models: [modelCfg('rt', port, { holdTimeoutSeconds: 20 })] },
    { redisUrl: redis.url, instanceId: 'act-rt' });
  try {
    const t0 = Date.now();
    const old = settle(complete(act.port, 'rt', { timeoutMs: 30000 }));
    await waitUntil(async () => (await act.model('rt')).held === 1, 3000, { what: 'held 1' });
    await reload(act, { models: [modelCfg('rt', port, { holdTimeoutSeconds: 1 })] });
    const t1 = Date.now();
    const fresh = await settle(complete(act.port, 'rt', { timeoutMs: 30000 }));
    const dt = Date.now() - t1;
    assert.equal(fresh.status, 504, `${fresh.status} ${fresh.body}`);
    assert.ok(dt >= 900 && dt < 3000, `the one held after the reload: 504 after ${dt} ms (1 s timeout)`);
    const o = await old;
    assert.equal(o.status, 504);
    assert.ok(Date.now() - t0 < 5000, 'the one held before: 504 by its arrival + 1 s, not 20 s');
    await assertAccounted(act);
  } finally {
    await act.stop();
  }
});

test('a reload that moves a ready model from an IP to a name (no model used names before): it stays ready, no wake, served at once', async () => {
  const port = await freePort();
  const fv = await startFakeVllm({ model: 'dn1', port });
  const act = await startActivator({ models: [modelCfg('dn1', port)] }, { redisUrl: redis.url });
  try {
    assert.equal((await complete(act.port, 'dn1')).status, 200);
    const before = await act.model('dn1');
    assert.equal(before.state, 'ready');
    const since = act.proc.mark();
    // The same replica, now by name: the first name any model uses, so the
    // resolver is made by this reload.
    await reload(act, { models: [{ ...modelCfg('dn1', port), backend: `http://localhost:${port}` }] });
    const t0 = Date.now();
    const r = await complete(act.port, 'dn1');
    assert.equal(r.status, 200, r.body.toString());
    assert.ok(Date.now() - t0 < 2000, `served ${Date.now() - t0} ms after the reload`);
    const after = await act.model('dn1');
    assert.equal(after.state, 'ready');
    assert.equal(after.coldStarts, before.coldStarts, 'no cold start for the lookup');
    assert.equal(after.wakeSignals, before.wakeSignals, 'no wake for the lookup');
    assert.equal(act.proc.lines.slice(since).filter((l) => /dns_unavailable|backend_reconfigure_failed|model_state model=dn1/.test(l.line)).length, 0,
      act.proc.lines.slice(since).map((l) => l.line).join('\n'));
    // The name's answer replaced the list (localhost: 127.0.0.1 and maybe ::1).
    await waitUntil(async () => (await act.model('dn1')).endpoints.some((e) => e.healthy), 3000,
      { what: 'a healthy endpoint from the name' });
    await assertAccounted(act);
  } finally {
    await act.stop();
    await fv.stop();
  }
});
