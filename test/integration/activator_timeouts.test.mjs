// thaw-activator timeouts, with short values set through the config: a
// request body that stops arriving (408), a backend that accepts and never
// answers (504), a backend that goes quiet mid-stream (the response is cut,
// never completed), a backend that stops reading the request body (504), and
// a client that leaves while its request is held (dropped at once; the held
// gauge and the Redis held count follow). Backend: an in-process Node server
// whose paths choose its misbehaviour.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { after, before, test } from 'node:test';

import {
  assert, assertAccounted, freePort, metricSum, promtoolCheck, rawBody, request, sleep, startActivator,
  statusCodes, tmpDir, waitUntil,
} from './activator_lib.mjs';
import { binPath, startRedis } from './lib/harness.mjs';

const BODY_IDLE_MS = 500;
const T_HEAD_MS = 400;      // model t's own responseHeaderTimeoutSeconds
const DEF_HEAD_MS = 1500;   // defaults.responseHeaderTimeoutSeconds (model u)
const IDLE_MS = 600;        // defaults.responseIdleTimeoutSeconds
const SLACK_MS = 1500;      // upper bound slack (sanitizer builds, a busy 2-core box)

let backend;
let redis;
let act;

function startBackend() {
  return new Promise((resolve) => {
    const b = { count: {}, closed: {}, paused: [], server: null, port: 0 };
    const track = (name, req) => {
      b.count[name] = (b.count[name] ?? 0) + 1;
      req.socket.once('close', () => { b.closed[name] = (b.closed[name] ?? 0) + 1; });
    };
    b.server = http.createServer((req, res) => {
      const p = req.url;
      if (p === '/health') { res.end('ok'); return; }
      if (p === '/silent') { track('silent', req); req.resume(); return; }   // never answers
      if (p === '/noread') {
        track('noread', req);
        req.pause();
        req.socket.pause();
        b.paused.push(req);
        return;
      }
      if (p === '/stall-chunked') {
        track('stall', req);
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: first\n\n');                                          // then nothing
        return;
      }
      if (p === '/stall-length') {
        track('stall', req);
        req.resume();
        res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 100 });
        res.write('x'.repeat(10));
        return;
      }
      if (p === '/slow-sse') {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        let i = 0;
        const tick = () => {
          res.write(`data: ${i}\n\n`);
          if (++i === 5) { res.end('data: [DONE]\n\n'); return; }
          setTimeout(tick, IDLE_MS / 2);
        };
        tick();
        return;
      }
      // /echo: reads the whole body, answers its length.
      track('echo', req);
      let n = 0;
      let complete = false;
      req.on('data', (c) => { n += c.length; });
      req.on('end', () => {
        complete = true;
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ bodyLength: n }));
      });
      req.socket.once('close', () => { if (!complete) b.incomplete = (b.incomplete ?? 0) + 1; });
    });
    b.server.listen(0, '127.0.0.1', () => { b.port = b.server.address().port; resolve(b); });
  });
}

/**
 * Raw client: writes pieces ({data} or {wait: ms}), collects what comes back
 * until the peer closes or totalMs pass. Write errors (the proxy closing on
 * a client that is still sending) are not failures here. Resolves {text,
 * closed, reset, tClosed, tLastWrite}.
 */
function rawClient(port, pieces, { totalMs = 15000, onSocket } = {}) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    const out = { text: '', closed: false, reset: false, tClosed: 0, tLastWrite: 0 };
    const bufs = [];
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(total);
      out.text = Buffer.concat(bufs).toString('latin1');
      out.tClosed = Date.now();
      s.destroy();
      resolve(out);
    };
    const total = setTimeout(finish, totalMs);
    s.on('data', (d) => bufs.push(d));
    s.on('end', () => { out.closed = true; finish(); });
    s.on('close', () => { out.closed = true; finish(); });
    s.on('error', (e) => {
      if (e.code === 'ECONNRESET') out.reset = true;
      out.closed = true;
      finish();
    });
    s.on('connect', async () => {
      onSocket?.(s);
      for (const p of pieces) {
        if (s.destroyed) return;
        if (p.wait) await sleep(p.wait);
        else { s.write(p.data); out.tLastWrite = Date.now(); }
      }
    });
  });
}

const outcomes = async () => {
  const m = await act.metrics();
  return (o, model) => metricSum(m, 'thaw_activator_requests_total', model ? { model, outcome: o } : { outcome: o });
};

before(async () => {
  backend = await startBackend();
  redis = await startRedis();
  const dead = await freePort(); // nothing listens: the cold model stays waking
  const be = `http://127.0.0.1:${backend.port}`;
  act = await startActivator({
    limits: {
      bodyIdleTimeoutSeconds: BODY_IDLE_MS / 1000, routeBodyBytes: 256, bufferBytes: 4096,
      maxHeaderBytes: 1024, headerTimeoutSeconds: 5, maxBodyBytes: 64 * 1024 * 1024,
    },
    defaults: {
      responseHeaderTimeoutSeconds: DEF_HEAD_MS / 1000, responseIdleTimeoutSeconds: IDLE_MS / 1000,
      probeInitialMs: 5, probeMaxMs: 20,
    },
    models: [
      { name: 't', backend: be, hosts: ['t.local'], responseHeaderTimeoutSeconds: T_HEAD_MS / 1000 },
      { name: 'u', backend: be, hosts: ['u.local'] },
      { name: 'cold', backend: `http://127.0.0.1:${dead}`, holdTimeoutSeconds: 60 },
    ],
  }, { redisUrl: redis.url });
  // Warm both models (first requests wake and probe them).
  for (const host of ['t.local', 'u.local']) {
    const r = await request(act.port, { path: '/echo', headers: { host } });
    assert.equal(r.status, 200);
  }
});

after(async () => {
  await act?.stop();
  backend?.server.closeAllConnections();
  await new Promise((resolve) => backend?.server.close(resolve));
});

test('bad timeout values are refused, naming the field', async () => {
  const dir = tmpDir('thaw-act-bad-');
  const cases = [
    [{ models: [{ name: 'a', backend: 'http://127.0.0.1:1', responseIdleTimeoutSeconds: 0 }] },
      'models[0].responseIdleTimeoutSeconds: expected a number in 0.01..86400'],
    [{ defaults: { responseHeaderTimeoutSeconds: 'soon' }, models: [{ name: 'a', backend: 'http://127.0.0.1:1' }] },
      'defaults.responseHeaderTimeoutSeconds: expected a number'],
    [{ limits: { bodyIdleTimeoutSeconds: -2 }, models: [{ name: 'a', backend: 'http://127.0.0.1:1' }] },
      'limits.bodyIdleTimeoutSeconds: expected a number in 0.01..3600'],
  ];
  for (const [cfg, want] of cases) {
    const file = path.join(dir, 'bad.json');
    fs.writeFileSync(file, JSON.stringify(cfg));
    const { code, stderr } = await new Promise((resolve) => {
      execFile(binPath('thaw-activator'), ['--config', file, '--listen', '127.0.0.1:0',
        '--admin-listen', '127.0.0.1:0'], { timeout: 10000 },
      (err, _stdout, se) => resolve({ code: err ? err.code : 0, stderr: se }));
    });
    assert.equal(code, 2, stderr);
    assert.ok(stderr.includes(want), `stderr ${stderr} lacks ${want}`);
  }
});

test('a backend that never answers: 504 with a reason after responseHeaderTimeout (per model, or from defaults), never resent', async () => {
  const before_ = await outcomes();
  const sent0 = backend.count.silent ?? 0;
  let t0 = Date.now();
  const r = await request(act.port, { path: '/silent', headers: { host: 't.local' } });
  let dt = Date.now() - t0;
  assert.equal(r.status, 504, r.body.toString());
  const e = JSON.parse(r.body).error;
  assert.equal(e.code, 'upstream_timeout');
  assert.equal(e.type, 'server_error');
  assert.match(e.message, /no response head for 400 ms \(responseHeaderTimeoutSeconds\)/);
  assert.ok(dt >= T_HEAD_MS - 20 && dt < T_HEAD_MS + SLACK_MS, `504 after ${dt} ms`);

  // A POST (whole body buffered, so replayable) is not resent either.
  t0 = Date.now();
  const r2 = await request(act.port, { path: '/silent', method: 'POST', headers: { host: 'u.local' },
    body: JSON.stringify({ model: 'u', prompt: 'x' }) });
  dt = Date.now() - t0;
  assert.equal(r2.status, 504);
  assert.match(JSON.parse(r2.body).error.message, /for 1500 ms/);
  assert.ok(dt >= DEF_HEAD_MS - 20 && dt < DEF_HEAD_MS + SLACK_MS, `defaults: 504 after ${dt} ms`);
  assert.equal((backend.count.silent ?? 0) - sent0, 2, 'each request reached the backend once');
  // The upstream connections were closed, not pooled.
  await waitUntil(() => (backend.closed.silent ?? 0) === backend.count.silent, 3000,
    { what: 'silent upstream connections closed' });
  const after_ = await outcomes();
  assert.equal(after_('upstream_timeout', 't') - before_('upstream_timeout', 't'), 1);
  assert.equal(after_('upstream_timeout', 'u') - before_('upstream_timeout', 'u'), 1);
});

test('a backend that goes quiet mid-stream: the response is cut, never completed', async () => {
  const before_ = await outcomes();
  // Chunked to an HTTP/1.1 client: closed without the last chunk.
  const a = await rawClient(act.port, [{ data: 'GET /stall-chunked HTTP/1.1\r\nHost: t.local\r\n\r\n' }]);
  assert.deepEqual(statusCodes(a.text), [200], a.text);
  assert.match(a.text, /transfer-encoding: chunked/i);
  assert.ok(a.text.includes('data: first'), a.text);
  assert.ok(!a.text.endsWith('0\r\n\r\n'), `looks complete: ${JSON.stringify(a.text.slice(-40))}`);
  assert.ok(a.closed);
  const dt = a.tClosed - a.tLastWrite;
  assert.ok(dt >= IDLE_MS - 20 && dt < IDLE_MS + SLACK_MS, `cut after ${dt} ms`);

  // Node's client sees the truncation as an error, not as a response.
  await assert.rejects(request(act.port, { path: '/stall-chunked', headers: { host: 'u.local' } }),
    /aborted|ECONNRESET|socket hang up/);

  // Content-Length: a short body, then the close.
  const b = await rawClient(act.port, [{ data: 'GET /stall-length HTTP/1.1\r\nHost: t.local\r\n\r\n' }]);
  assert.deepEqual(statusCodes(b.text), [200]);
  assert.match(b.text, /content-length: 100/i);
  assert.ok(b.text.endsWith('\r\n\r\n' + 'x'.repeat(10)), JSON.stringify(b.text.slice(-40)));
  assert.ok(b.closed);

  // HTTP/1.0: the end of the body is the close, so a plain close would look
  // complete; the client gets a reset instead.
  const c = await rawClient(act.port, [{ data: 'GET /stall-chunked HTTP/1.0\r\nHost: t.local\r\n\r\n' }]);
  assert.ok(c.text.includes('data: first'), c.text);
  assert.ok(c.reset, 'HTTP/1.0 client: reset, not a clean close');

  // Pauses shorter than the idle timeout, a whole stream longer than it: fine.
  const s = await request(act.port, { path: '/slow-sse', headers: { host: 't.local' } });
  assert.equal(s.status, 200);
  assert.ok(s.body.toString().endsWith('data: [DONE]\n\n'));
  assert.ok(s.tEnd - s.tHead >= IDLE_MS, `stream lasted ${s.tEnd - s.tHead} ms`);

  await waitUntil(() => (backend.closed.stall ?? 0) === backend.count.stall, 3000,
    { what: 'stalled upstream connections closed' });
  const after_ = await outcomes();
  assert.equal(after_('upstream_timeout') - before_('upstream_timeout'), 4);
  assert.equal(after_('aborted') - before_('aborted'), 0);
});

test('a request body that stops arriving: 408 after bodyIdleTimeout, upstream closed; a slow steady body passes', async () => {
  const before_ = await outcomes();
  const incomplete0 = backend.incomplete ?? 0;
  // The body start (over routeBodyBytes) routes it and it is forwarded; then
  // the client falls silent with 1600 bytes still owed.
  const start = `{"model":"t","pad":"${'a'.repeat(380)}`;
  const head = 'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n';
  const a = await rawClient(act.port, [{ data: head }, { data: start }]);
  assert.deepEqual(statusCodes(a.text), [408], a.text);
  const err = JSON.parse(a.text.slice(a.text.indexOf('{'))).error;
  assert.equal(err.code, 'request_timeout');
  assert.match(err.message, /bodyIdleTimeoutSeconds/);
  assert.match(a.text, /connection: close/i);
  assert.ok(a.closed);
  const dt = a.tClosed - a.tLastWrite;
  assert.ok(dt >= BODY_IDLE_MS - 20 && dt < BODY_IDLE_MS + SLACK_MS, `408 after ${dt} ms`);
  // The backend got a partial request and its connection was closed.
  await waitUntil(() => (backend.incomplete ?? 0) - incomplete0 === 1, 3000,
    { what: 'partial upstream request closed' });

  // 2000 bytes over ~1.8 s in 10 pieces, each gap under the idle timeout.
  const body = `{"model":"t","pad":"${'b'.repeat(2000 - 22)}"}`;
  assert.equal(body.length, 2000);
  const pieces = [{ data: head.replace('Host: x', 'Host: x\r\nConnection: close') }];
  for (let i = 0; i < 10; i++) {
    pieces.push({ data: body.slice(i * 200, (i + 1) * 200) });
    if (i < 9) pieces.push({ wait: BODY_IDLE_MS * 0.4 });
  }
  const b = await rawClient(act.port, pieces);
  assert.deepEqual(statusCodes(b.text), [200], b.text);
  assert.equal(JSON.parse(rawBody(b.text)).bodyLength, 2000);

  const after_ = await outcomes();
  assert.equal(after_('body_timeout', 't') - before_('body_timeout', 't'), 1);
  assert.equal(after_('header_timeout') - before_('header_timeout'), 0);
});

test('a backend that stops reading the request body: 504 after bodyIdleTimeout', async () => {
  const before_ = await outcomes();
  // Far more than the kernel and proxy buffers between client and backend hold.
  const n = 24 * 1024 * 1024;
  const body = Buffer.alloc(n, 'c');
  Buffer.from('{"model":"t","pad":"').copy(body);
  const head = `POST /noread HTTP/1.1\r\nHost: x\r\nContent-Length: ${n}\r\n\r\n`;
  const t0 = Date.now();
  const r = await rawClient(act.port, [{ data: head }, { data: body }]);
  const dt = Date.now() - t0;
  assert.deepEqual(statusCodes(r.text), [504], r.text.slice(0, 300));
  const err = JSON.parse(r.text.slice(r.text.indexOf('{'))).error;
  assert.equal(err.code, 'upstream_timeout');
  assert.match(err.message, /stopped reading the request body/);
  assert.ok(dt < BODY_IDLE_MS + 5000, `504 after ${dt} ms`);
  // A paused socket cannot see the close: read again, then the FIN arrives.
  for (const req of backend.paused.splice(0)) { req.socket.resume(); req.resume(); }
  await waitUntil(() => (backend.closed.noread ?? 0) === backend.count.noread, 3000,
    { what: 'upstream connection closed' });
  const log = act.proc.lines.map((l) => l.line).filter((l) => l.includes('event=body_timeout'));
  assert.ok(log.some((l) => l.includes('waiting_on=backend')), log.join('\n'));
  const after_ = await outcomes();
  assert.equal(after_('upstream_timeout', 't') - before_('upstream_timeout', 't'), 1);
  assert.equal(after_('body_timeout') - before_('body_timeout'), 0);
});

test('a client that leaves while held is dropped at once; held gauge and Redis follow; counted client_closed', async () => {
  const held = async () => metricSum(await act.metrics(), 'thaw_activator_held_requests', { model: 'cold' });
  const redisHeld = async () => {
    const v = await redis.cli('HGET', 'thaw:held:cold', 'act-test');
    return v ? Number(v.split(':')[0]) : 0;
  };
  const before_ = await outcomes();
  const gone = () => act.proc.lines.filter((l) => l.line.includes('event=held_client_gone')).length;

  // 1. A small request: its EOF is read at once.
  // 2. A body larger than the proxy reads while holding, so reading stopped
  //    at the buffer bound: the FIN sits behind unread bytes.
  // 3. The same, closed with a reset.
  const small = JSON.stringify({ model: 'cold', prompt: 'hi' });
  const bigLen = 32 * 1024;
  const big = Buffer.alloc(bigLen, 'd');
  Buffer.from('{"model":"cold","pad":"').copy(big);
  const cases = [
    { name: 'small', data: `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${small.length}\r\n\r\n${small}`, how: 'end' },
    { name: 'big-fin', data: [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${bigLen}\r\n\r\n`, big], how: 'end', polled: true },
    { name: 'big-rst', data: [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${bigLen}\r\n\r\n`, big], how: 'reset', polled: true },
  ];
  for (const c of cases) {
    const gone0 = gone();
    let sock;
    const done = rawClient(act.port, [].concat(c.data).map((d) => ({ data: d })),
      { onSocket: (s) => { sock = s; } });
    await waitUntil(async () => (await held()) === 1, 5000, { what: `${c.name}: held gauge 1` });
    await waitUntil(async () => (await redisHeld()) === 1, 5000, { what: `${c.name}: Redis held count 1` });
    await sleep(300); // let the proxy read what it will of the body
    const t0 = Date.now();
    if (c.how === 'reset') sock.resetAndDestroy(); else sock.destroy();
    await waitUntil(async () => (await held()) === 0, 2000, { what: `${c.name}: held gauge 0`, intervalMs: 20 });
    const dt = Date.now() - t0;
    assert.ok(dt < 1000, `${c.name}: dropped after ${dt} ms`);
    // Redis follows (the HDEL goes out with the drop of the last held request).
    await waitUntil(async () => (await redis.cli('HEXISTS', 'thaw:held:cold', 'act-test')) === '0', 2000,
      { what: `${c.name}: Redis held field removed` });
    if (c.polled) assert.equal(gone() - gone0, 1, `${c.name}: found by the socket check`);
    await done;
  }
  const after_ = await outcomes();
  assert.equal(after_('client_closed', 'cold') - before_('client_closed', 'cold'), 3);
  assert.equal(after_('hold_timeout', 'cold') - before_('hold_timeout', 'cold'), 0);
});

// RFC 9112 2.2: a server SHOULD ignore at least one empty line before a
// request line. A CRLF after a POST body used to start the header timer on
// the idle connection: an unsolicited 408 after headerTimeoutSeconds, counted
// as an accepted request that timed out.
test('empty lines between keep-alive requests are ignored: no header timer, no phantom request', async () => {
  const HEAD_MS = 500;
  const own = await startActivator({
    limits: { headerTimeoutSeconds: HEAD_MS / 1000, idleTimeoutSeconds: 30 },
    models: [{ name: 'e', backend: `http://127.0.0.1:${backend.port}`, hosts: ['e.local'], probeInitialMs: 5, probeMaxMs: 20 }],
  });
  try {
    const post = 'POST /echo HTTP/1.1\r\nHost: e.local\r\nContent-Length: 2\r\n\r\nhi';
    const r = await rawClient(own.port, [
      { data: `${post}\r\n` },
      { wait: HEAD_MS * 3 },
      { data: '\r\n\n\r\n' }, // a bare LF too (RFC 9112 2.2 allows it as a line end)
      { wait: HEAD_MS * 3 },
      { data: 'GET /echo HTTP/1.1\r\nHost: e.local\r\nConnection: close\r\n\r\n' },
    ], { totalMs: 15000 });
    assert.deepEqual(statusCodes(r.text), [200, 200], r.text);
    assert.ok(r.closed);
    const m = await own.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_accepted_total'), 2);
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { outcome: 'ok' }), 2);
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { outcome: 'header_timeout' }), 0);
    // Bounded: a stream of empty lines is a request head in the end (408).
    const flood = await rawClient(own.port, [{ data: '\r\n'.repeat(100) }], { totalMs: 10000 });
    assert.deepEqual(statusCodes(flood.text), [408], flood.text);
    await assertAccounted(own);
  } finally {
    await own.stop();
  }
});

test('every accepted request is accounted for; metrics pass promtool', async () => {
  await assertAccounted(act);
  const text = await act.metricsText();
  const check = await promtoolCheck(text);
  assert.equal(check.code, 0, check.out);
  assert.match(text, /thaw_activator_requests_total\{model="t",outcome="body_timeout"\} 1/);
  assert.match(text, /thaw_activator_requests_total\{model="t",outcome="upstream_timeout"\} \d+/);
});
