// thaw-activator SIGTERM drain: stop accepting, finish in-flight and held
// requests up to the drain timeout, answer the rest 503, exit 0.
import http from 'node:http';
import { test } from 'node:test';

import {
  assert, complete, freePort, rawExchange, request, sleep,
  startActivator, startFakeVllm, statusCodes, waitUntil,
} from './activator_lib.mjs';
import { canConnect } from './lib/harness.mjs';

function modelCfg(name, port, extra = {}) {
  return { name, backend: `http://127.0.0.1:${port}`, probeInitialMs: 5, probeMaxMs: 20, ...extra };
}

test('SIGTERM: in-flight streams and held requests finish, new connections are refused, exit 0', async () => {
  const [pa, pb] = [await freePort(), await freePort()];
  const fa = await startFakeVllm({ model: 'slow', port: pa, tokensPerSecond: 10, waitReady: true });
  const act = await startActivator({
    limits: { drainTimeoutSeconds: 10 },
    models: [modelCfg('slow', pa), modelCfg('held', pb)],
  });
  // A keep-alive connection that stays idle: closed at once on SIGTERM.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  assert.equal((await complete(act.port, 'slow', { agent })).status, 200);
  // ~1 s of tokens.
  const stream = request(act.port, {
    path: '/v1/chat/completions',
    body: { model: 'slow', stream: true, max_tokens: 10, messages: [{ role: 'user', content: 'x' }] },
  });
  const held = complete(act.port, 'held');
  await waitUntil(async () => (await act.model('held')).held === 1, 3000, { what: 'held' });
  await sleep(100);
  const t0 = Date.now();
  act.proc.proc.kill('SIGTERM');
  await act.proc.waitForLog(/event=draining/);
  assert.equal(await canConnect(act.port), false, 'listener closed');
  const rz = await request(act.adminPort, { path: '/readyz' });
  assert.equal(rz.status, 503);
  // The held model comes up during the drain: its request is served.
  const fb = await startFakeVllm({ model: 'held', port: pb });
  const h = await held;
  assert.equal(h.status, 200);
  assert.match(h.headers.connection ?? '', /close/);
  const s = await stream;
  assert.equal(s.status, 200);
  assert.ok(s.body.toString().trimEnd().endsWith('data: [DONE]'));
  const code = await act.proc.exited;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 5000);
  agent.destroy();
  await fa.stop();
  await fb.stop();
});

test('drain deadline: held requests get 503, cut streams end, still exit 0', async () => {
  const [pa, pb] = [await freePort(), await freePort()];
  const fa = await startFakeVllm({ model: 'slow2', port: pa, tokensPerSecond: 5, waitReady: true });
  const act = await startActivator({
    limits: { drainTimeoutSeconds: 0.5, retryAfterSeconds: 3 },
    models: [modelCfg('slow2', pa), modelCfg('never', pb)],
  });
  const held = complete(act.port, 'never');
  const stream = request(act.port, {
    path: '/v1/chat/completions',
    body: { model: 'slow2', stream: true, max_tokens: 50, messages: [{ role: 'user', content: 'x' }] },
  }).catch((e) => ({ error: e }));
  await waitUntil(async () => (await act.model('never')).held === 1, 3000, { what: 'held' });
  await sleep(300);
  // An open connection with an answered request: closed by the drain.
  const ka = rawExchange(act.port, ['GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n'], { idleMs: 3000 });
  await sleep(100);
  const t0 = Date.now();
  act.proc.proc.kill('SIGTERM');
  const h = await held;
  assert.equal(h.status, 503);
  assert.equal(h.headers['retry-after'], '3');
  assert.equal(JSON.parse(h.body).error.code, 'draining');
  const dt = Date.now() - t0;
  assert.ok(dt >= 400 && dt < 2000, `503 after ${dt} ms`);
  const s = await stream;
  // Cut mid-stream: either an error or a body without [DONE].
  assert.ok(s.error || !s.body.toString().includes('[DONE]'));
  const k = await ka;
  assert.ok(k.closed);
  assert.equal(await act.proc.exited, 0);
  await fa.stop();
});

test('SIGTERM while idle on a kept-alive connection: a late request is refused 503; SIGHUP is ignored', async () => {
  const pa = await freePort();
  const fa = await startFakeVllm({ model: 'ka', port: pa, waitReady: true });
  const act = await startActivator({ limits: { drainTimeoutSeconds: 2 }, models: [modelCfg('ka', pa)] });
  // A request whose head is half-sent when SIGTERM lands gets an answer.
  const net = await import('node:net');
  const s = net.connect(act.port, '127.0.0.1');
  await new Promise((r) => s.on('connect', r));
  let got = '';
  s.on('data', (d) => { got += d.toString(); });
  const closed = new Promise((r) => s.on('close', r));
  s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
  await sleep(100);
  act.proc.proc.kill('SIGTERM');
  await act.proc.waitForLog(/event=draining/);
  // A draining proxy takes no new config: a model it would add would hold
  // and wake for an instance on its way out.
  act.writeConfig({ limits: { drainTimeoutSeconds: 2 }, models: [modelCfg('ka', pa), modelCfg('kb', pa)] });
  act.proc.proc.kill('SIGHUP');
  await act.proc.waitForLog(/event=reload_ignored reason="draining"/);
  assert.ok(!/config_reloaded/.test(act.proc.output()), 'reloaded while draining');
  // Nor does it wake anything: the admin wake says so instead of 202.
  const wake = await request(act.adminPort, { path: '/models/ka/wake', method: 'POST' });
  assert.equal(wake.status, 503);
  assert.equal(JSON.parse(wake.body).error.code, 'draining');
  const body = JSON.stringify({ model: 'ka', prompt: 'x' });
  s.write(`Content-Length: ${body.length}\r\n\r\n${body}`);
  await closed;
  assert.deepEqual(statusCodes(got), [503]);
  assert.match(got, /Connection: close/);
  assert.equal(await act.proc.exited, 0);
  await fa.stop();
});
