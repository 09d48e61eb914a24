// thaw-activator warm path: routing, header handling, body streaming, limits,
// keep-alive and pipelining, SSE token-by-token, metrics. Backends: a real
// thaw-fake-vllm and an in-process echo server (to see what arrives).
import http from 'node:http';
import { after, before, test } from 'node:test';

import {
  assert, assertAccounted, complete, metricSum, promtoolCheck, rawBody, rawExchange, request,
  sleep, startActivator, startFakeVllm, statusCodes,
} from './activator_lib.mjs';

let echo;           // {server, port, connections, requests}
let fv;             // fake vLLM serving m1
let act;

function startEcho() {
  return new Promise((resolve) => {
    const e = { connections: 0, requests: [] };
    e.server = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks);
        e.requests.push({ method: req.method, url: req.url, headers: req.headers, body });
        if (req.url === '/health') { res.end('ok'); return; }
        // A backend that drops a kept-alive connection when the next request
        // arrives on it (the keep-alive race), without a byte of answer.
        req.socket.served = (req.socket.served ?? 0) + 1;
        if (req.url === '/flaky' && req.socket.served > 1) {
          e.dropped = (e.dropped ?? 0) + 1;
          req.socket.destroy();
          return;
        }
        if (req.url.startsWith('/big/')) {
          const n = Number(req.url.slice(5));
          const block = Buffer.alloc(65536, 'x');
          let left = n;
          const pump = () => {
            while (left > 0) {
              const k = Math.min(left, block.length);
              left -= k;
              if (!res.write(block.subarray(0, k))) { res.once('drain', pump); return; }
            }
            res.end();
          };
          res.writeHead(200, { 'content-type': 'application/octet-stream' });
          pump();
          return;
        }
        const out = JSON.stringify({
          method: req.method, url: req.url, headers: req.headers,
          bodyLength: body.length, bodyHead: body.subarray(0, 200).toString(),
          bodyTail: body.subarray(Math.max(0, body.length - 50)).toString(),
        });
        res.writeHead(200, { 'content-type': 'application/json', 'x-backend': 'echo',
          connection: 'keep-alive', 'keep-alive': 'timeout=5' });
        res.end(out);
      });
    });
    e.server.keepAliveTimeout = 30000;
    e.server.on('connection', () => { e.connections++; });
    e.server.listen(0, '127.0.0.1', () => { e.port = e.server.address().port; resolve(e); });
  });
}

before(async () => {
  echo = await startEcho();
  fv = await startFakeVllm({ model: 'm1', tokensPerSecond: 20, waitReady: true });
  act = await startActivator({
    limits: {
      maxHeaderBytes: 4096, maxHeaders: 50, maxBodyBytes: 200000, routeBodyBytes: 1024,
      headerTimeoutSeconds: 0.5, idleTimeoutSeconds: 5, bufferBytes: 65536,
    },
    models: [
      { name: 'm1', backend: fv.url, aliases: ['m1-alias', 'm1-lora-*'], probeInitialMs: 5, probeMaxMs: 20 },
      { name: 'echo', backend: `http://127.0.0.1:${echo.port}`, hosts: ['echo.local', '*.echo.test'],
        aliases: ['echo-*'], probeInitialMs: 5, probeMaxMs: 20 },
    ],
  });
});

after(async () => {
  await act?.stop();
  await new Promise((resolve) => echo?.server.close(resolve));
  echo?.server.closeAllConnections?.();
});

test('routes by model, alias glob and Host; unknown model is a 404 in OpenAI shape', async () => {
  const r1 = await complete(act.port, 'm1');
  assert.equal(r1.status, 200, r1.body.toString());
  assert.equal(JSON.parse(r1.body).model, 'm1');

  const r2 = await request(act.port, { path: '/v1/completions', body: { model: 'echo-small', prompt: 'x' } });
  assert.equal(r2.status, 200);
  assert.equal(r2.headers['x-backend'], 'echo');

  const r3 = await request(act.port, { path: '/anything', headers: { host: 'api.echo.test:1234' } });
  assert.equal(r3.status, 200);
  assert.equal(JSON.parse(r3.body).url, '/anything');

  const r4 = await complete(act.port, 'no-such-model');
  assert.equal(r4.status, 404);
  assert.deepEqual(JSON.parse(r4.body), { error: {
    message: 'The model `no-such-model` does not exist.', type: 'invalid_request_error',
    param: null, code: 'model_not_found' } });
  assert.match(r4.headers['content-type'], /application\/json/);

  const r5 = await request(act.port, { path: '/v1/models', headers: { host: 'unknown.example' } });
  assert.equal(r5.status, 404);
  assert.equal(JSON.parse(r5.body).error.code, 'model_not_found');

  const r6 = await request(act.port, { path: '/v1/completions', body: '{"model": 5}' });
  assert.equal(r6.status, 400);
  assert.equal(JSON.parse(r6.body).error.type, 'invalid_request_error');
});

test('forwarded headers: X-Forwarded-For appended, hop-by-hop and Connection-named fields dropped', async () => {
  const r = await request(act.port, {
    path: '/v1/x?q=1', method: 'POST',
    headers: {
      host: 'echo.local', 'x-forwarded-for': '10.1.1.1', connection: 'keep-alive, X-Secret',
      'x-secret': 'hide', 'keep-alive': 'timeout=5', te: 'trailers', 'x-thaw-priority': 'high',
      'x-custom': 'kept', 'content-type': 'application/json',
    },
    body: JSON.stringify({ prompt: 'no model here' }),
  });
  assert.equal(r.status, 200, r.body.toString());
  const seen = JSON.parse(r.body);
  assert.equal(seen.url, '/v1/x?q=1');
  assert.equal(seen.headers['x-forwarded-for'], '10.1.1.1, 127.0.0.1');
  assert.equal(seen.headers.host, 'echo.local');
  assert.equal(seen.headers['x-custom'], 'kept');
  for (const h of ['x-secret', 'keep-alive', 'te', 'x-thaw-priority']) assert.equal(seen.headers[h], undefined, h);
  assert.equal(seen.bodyLength, JSON.stringify({ prompt: 'no model here' }).length);
  // The response's hop-by-hop fields are ours to set, not the backend's.
  assert.equal(r.headers['keep-alive'], undefined);
});

test('request bodies: chunked in, large bodies streamed through intact', async () => {
  // Chunked, small: buffered whole, sent upstream with a Content-Length.
  const raw = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n' +
    'Content-Type: application/json\r\nConnection: close\r\n\r\n' +
    '10\r\n{"model":"echo-a\r\n5;ext=1\r\n", "p\r\n7\r\nrompt":\r\n4\r\n"x"}\r\n0\r\nX-Trailer: 1\r\n\r\n';
  const x = await rawExchange(act.port, raw);
  assert.deepEqual(statusCodes(x.text), [200], x.text);
  const seen = JSON.parse(rawBody(x.text));
  assert.equal(seen.bodyHead, '{"model":"echo-a", "prompt":"x"}');
  assert.equal(seen.headers['content-length'], String(seen.bodyLength));
  assert.equal(seen.headers['transfer-encoding'], undefined);

  // Bigger than routeBodyBytes: the model comes from the start, the rest streams.
  const pad = 'y'.repeat(150000);
  const big = JSON.stringify({ model: 'echo-big', prompt: pad, end: 'END' });
  const r = await request(act.port, { path: '/v1/completions', body: big });
  assert.equal(r.status, 200);
  const s2 = JSON.parse(r.body);
  assert.equal(s2.bodyLength, big.length);
  assert.ok(s2.bodyTail.endsWith('"end":"END"}'));

  // Same, chunked from the client: goes upstream chunked.
  const chunks = [];
  for (let i = 0; i < big.length; i += 7000) {
    const c = big.slice(i, i + 7000);
    chunks.push(`${c.length.toString(16)}\r\n${c}\r\n`);
  }
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n';
  const y = await rawExchange(act.port, [head, ...chunks, '0\r\n\r\n'], { gapMs: 1 });
  assert.deepEqual(statusCodes(y.text), [200], y.text.slice(0, 300));
  const s3 = JSON.parse(rawBody(y.text));
  assert.equal(s3.bodyLength, big.length);
  assert.equal(s3.headers['transfer-encoding'], 'chunked');
});

test('Expect: 100-continue is answered before the body is sent', async () => {
  const body = JSON.stringify({ model: 'echo-e', prompt: 'z' });
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n' +
    `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
  const got = await new Promise((resolve, reject) => {
    const s = (async () => {
      const net = await import('node:net');
      const sock = net.connect(act.port, '127.0.0.1');
      let buf = '';
      let sent = false;
      sock.on('data', (d) => {
        buf += d.toString();
        if (!sent && buf.includes('100 Continue\r\n\r\n')) { sent = true; sock.write(body); }
      });
      sock.on('close', () => resolve(buf));
      sock.on('error', reject);
      sock.write(head);
    })();
    s.catch(reject);
  });
  assert.match(got, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK/);
  // Too large with Expect: refused at once, no 100.
  const big = await rawExchange(act.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
    'Expect: 100-continue\r\nContent-Length: 999999999\r\n\r\n');
  assert.deepEqual(statusCodes(big.text), [413]);
  assert.doesNotMatch(big.text, /100 Continue/);
  assert.ok(big.closed);
});

test('keep-alive both sides and pipelining', async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const before = echo.connections;
  let sock = null;
  for (let i = 0; i < 20; i++) {
    const r = await request(act.port, { path: `/k${i}`, headers: { host: 'echo.local' }, agent });
    assert.equal(r.status, 200);
    if (sock) assert.equal(r.socket, sock, 'client connection reused');
    sock = r.socket;
  }
  agent.destroy();
  // The upstream side reused pooled connections: far fewer than 20 new ones.
  assert.ok(echo.connections - before <= 2, `upstream connections: ${echo.connections - before}`);

  // Three pipelined requests in one write, answered in order.
  const pipe = ['/p1', '/p2', '/p3'].map((p) =>
    `GET ${p} HTTP/1.1\r\nHost: echo.local\r\n\r\n`).join('');
  const x = await rawExchange(act.port, pipe + 'GET /p4 HTTP/1.1\r\nHost: echo.local\r\nConnection: close\r\n\r\n');
  assert.deepEqual(statusCodes(x.text), [200, 200, 200, 200]);
  const urls = [...x.text.matchAll(/"url":"(\/p\d)"/g)].map((m) => m[1]);
  assert.deepEqual(urls, ['/p1', '/p2', '/p3', '/p4']);
  assert.ok(x.closed);

  // HTTP/1.0: answered, then closed.
  const y = await rawExchange(act.port, 'GET /old HTTP/1.0\r\nHost: echo.local\r\n\r\n');
  assert.match(y.text, /^HTTP\/1\.1 200 OK/);
  assert.match(y.text, /Connection: close/i);
  assert.ok(y.closed);
});

test('a pooled connection the backend dropped is retried on a fresh one, invisibly', async () => {
  const before = await act.metrics();
  const dropped = echo.dropped ?? 0;
  for (let i = 0; i < 6; i++) {
    const r = await request(act.port, { path: '/flaky', method: 'POST', body: '{"a":1}',
      headers: { host: 'echo.local', 'content-type': 'application/json' } });
    assert.equal(r.status, 200, r.body.toString());
    assert.equal(JSON.parse(r.body).bodyLength, 7);
  }
  assert.ok((echo.dropped ?? 0) - dropped >= 3, `dropped ${(echo.dropped ?? 0) - dropped}`);
  const after_ = await act.metrics();
  const bad = (m) => metricSum(m, 'thaw_activator_requests_total', { model: 'echo', outcome: 'bad_gateway' });
  assert.equal(bad(after_) - bad(before), 0);
  // A stale connection is not a dead endpoint.
  assert.equal(metricSum(after_, 'thaw_activator_endpoints', { model: 'echo', health: 'healthy' }), 1);
});

test('limits: 431, 413, 400, 408, each explicit and counted', async () => {
  const before = await act.metrics();
  const bigHead = `GET / HTTP/1.1\r\nHost: echo.local\r\nX-Big: ${'a'.repeat(5000)}\r\n\r\n`;
  const a = await rawExchange(act.port, bigHead);
  assert.deepEqual(statusCodes(a.text), [431]);
  assert.ok(a.closed);

  const many = 'GET / HTTP/1.1\r\nHost: echo.local\r\n' +
    Array.from({ length: 60 }, (_, i) => `X-H${i}: v\r\n`).join('') + '\r\n';
  assert.deepEqual(statusCodes((await rawExchange(act.port, many)).text), [431]);

  const b = await rawExchange(act.port, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n');
  assert.deepEqual(statusCodes(b.text), [413]);
  assert.equal(JSON.parse(b.text.slice(b.text.indexOf('{'))).error.code, 'request_too_large');

  // Chunked, too big: found while streaming (after routing).
  const piece = 'q'.repeat(50000);
  const chunked = ['POST /v1/completions HTTP/1.1\r\nHost: echo.local\r\nTransfer-Encoding: chunked\r\n\r\n',
    ...Array.from({ length: 6 }, () => `${piece.length.toString(16)}\r\n${piece}\r\n`), '0\r\n\r\n'];
  const c = await rawExchange(act.port, chunked, { gapMs: 2 });
  assert.deepEqual(statusCodes(c.text), [413], c.text.slice(0, 200));
  assert.ok(c.closed);

  const d = await rawExchange(act.port, 'GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n');
  assert.deepEqual(statusCodes(d.text), [400]);
  const e = await rawExchange(act.port, 'GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n');
  assert.deepEqual(statusCodes(e.text), [400]);

  // Head never finished: 408 after headerTimeoutSeconds.
  const t0 = Date.now();
  const f = await rawExchange(act.port, 'GET / HTTP/1.1\r\nHost: a\r\n', { idleMs: 3000 });
  assert.deepEqual(statusCodes(f.text), [408]);
  assert.ok(Date.now() - t0 < 2500);
  assert.ok(f.closed);

  const after_ = await act.metrics();
  const delta = (o) => metricSum(after_, 'thaw_activator_requests_total', { outcome: o }) -
    metricSum(before, 'thaw_activator_requests_total', { outcome: o });
  assert.equal(delta('headers_too_large'), 2);
  assert.ok(delta('body_too_large') >= 1);
  assert.ok(delta('bad_request') >= 2);
  assert.equal(delta('header_timeout'), 1);
});

test('an idle keep-alive connection is closed after idleTimeoutSeconds; a silent one too', async () => {
  const t0 = Date.now();
  const x = await rawExchange(act.port, 'GET /i HTTP/1.1\r\nHost: echo.local\r\n\r\n', { idleMs: 8000 });
  assert.deepEqual(statusCodes(x.text), [200]);
  assert.ok(x.closed);
  const dt = Date.now() - t0;
  assert.ok(dt >= 4500 && dt < 7500, `closed after ${dt} ms`);
});

test('SSE: tokens reach the client one by one, as they are produced', async () => {
  const r = await request(act.port, {
    path: '/v1/chat/completions',
    body: { model: 'm1', stream: true, max_tokens: 12, messages: [{ role: 'user', content: 'hi' }] },
  });
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'], /text\/event-stream/);
  const events = r.body.toString().split('\n\n').filter((e) => e.startsWith('data: '));
  assert.equal(events.at(-1), 'data: [DONE]');
  assert.ok(events.length >= 13, `events: ${events.length}`);
  // 20 tokens/s: 12 tokens take ~550 ms. Buffered delivery would arrive in one
  // or two reads at the end; streamed delivery spreads reads over the window.
  assert.ok(r.chunks.length >= 10, `reads: ${r.chunks.length}`);
  const span = r.chunkTimes.at(-1) - r.chunkTimes[0];
  assert.ok(span >= 400, `reads spread over ${span} ms`);
  const gaps = r.chunkTimes.slice(1).map((t, i) => t - r.chunkTimes[i]);
  const spaced = gaps.filter((g) => g >= 25).length;
  assert.ok(spaced >= 8, `gaps: ${gaps.join(',')}`);
});

test('large responses stream through bounded buffers intact', async () => {
  const n = 8 * 1024 * 1024 + 123;
  const r = await request(act.port, { path: `/big/${n}`, headers: { host: 'echo.local' } });
  assert.equal(r.status, 200);
  assert.equal(r.body.length, n);
  assert.ok(r.body.every((b) => b === 0x78));
});

test('metrics pass promtool and every accepted request is accounted for', async () => {
  await assertAccounted(act);
  const text = await act.metricsText();
  const check = await promtoolCheck(text);
  assert.equal(check.code, 0, check.out);
  const m = await act.metrics();
  assert.ok(metricSum(m, 'thaw_activator_requests_total', { model: 'm1', outcome: 'ok' }) >= 2);
  assert.ok(metricSum(m, 'thaw_activator_endpoints', { model: 'echo', health: 'healthy' }) === 1);
  assert.ok(text.includes('thaw_activator_hold_duration_seconds_bucket'));
  assert.ok(text.includes('thaw_activator_upstream_ttfb_seconds_count{model="m1"}'));
  // Admin endpoints.
  const h = await request(act.adminPort, { path: '/healthz' });
  assert.equal(h.status, 200);
  const rz = await request(act.adminPort, { path: '/readyz' });
  assert.equal(rz.status, 200);
  const models = await act.models();
  assert.deepEqual(models.models.map((x) => x.name), ['m1', 'echo']);
  assert.equal(models.models[0].state, 'ready');
  await sleep(0);
});
