// thaw-activator warm path: routing, header handling, body streaming, limits
// (with the lingering close that keeps early error answers from being lost),
// keep-alive and pipelining, SSE token-by-token, the send timeout for a client
// that stops reading, metrics. Backends: a real thaw-fake-vllm and an
// in-process echo server (to see what arrives).
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import zlib from 'node:zlib';
import { after, before, test } from 'node:test';

import {
  assert, assertAccounted, complete, freePort, metricSum, promtoolCheck, rawBody, rawExchange, request,
  sleep, startActivator, startFakeVllm, statusCodes, waitUntil,
} from './activator_lib.mjs';
import { tcpKeepalive } from './lib/harness.mjs';

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
        // RFC 9110 forbids Content-Length on a 204; node sends it if asked.
        if (req.url === '/no-content') { res.writeHead(204, { 'content-length': '5' }); res.end(); return; }
        // A transfer coding the activator does not decode: node frames the
        // body as chunked and sends the field as given.
        if (req.url === '/gzip-te') {
          res.writeHead(200, { 'transfer-encoding': 'gzip, chunked' });
          res.end(zlib.gzipSync('hello'));
          return;
        }
        // A backend that drops a kept-alive connection when the next request
        // arrives on it (the keep-alive race), without a byte of answer. A
        // server that closes with the request unread is reset by its kernel
        // (a FIN after reading it all would say it had the request: 502).
        req.socket.served = (req.socket.served ?? 0) + 1;
        if (req.url === '/flaky' && req.socket.served > 1) {
          e.dropped = (e.dropped ?? 0) + 1;
          req.socket.resetAndDestroy();
          return;
        }
        if (req.url === '/sse-forever') {
          // A token stream that never ends, written as fast as the reader
          // takes it; notes when its connection goes.
          const ev = Buffer.from(`data: ${'t'.repeat(200)}\n\n`.repeat(64));
          e.sse = { bytes: 0, closedAt: 0 };
          const st = e.sse;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.on('close', () => { st.closedAt = Date.now(); });
          const pump = () => {
            while (!res.destroyed) {
              st.bytes += ev.length;
              if (!res.write(ev)) { res.once('drain', pump); return; }
            }
          };
          pump();
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
  // The longest name, multi-byte: named whole, the body valid UTF-8 JSON.
  const longName = `a${'\u00e9'.repeat(255)}`;
  assert.equal(Buffer.byteLength(longName), 511);
  const r4b = await complete(act.port, longName);
  assert.equal(r4b.status, 404);
  const text = new TextDecoder('utf-8', { fatal: true }).decode(r4b.body);
  assert.equal(JSON.parse(text).error.message, `The model \`${longName}\` does not exist.`);

  const r5 = await request(act.port, { path: '/v1/models', headers: { host: 'unknown.example' } });
  assert.equal(r5.status, 404);
  assert.equal(JSON.parse(r5.body).error.code, 'model_not_found');

  const r6 = await request(act.port, { path: '/v1/completions', body: '{"model": 5}' });
  assert.equal(r6.status, 400);
  assert.equal(JSON.parse(r6.body).error.type, 'invalid_request_error');
});

test('our own error answers: closed when the client asked for a close, bodiless to HEAD', async () => {
  const unknown = (method, version, extra = '') =>
    `${method} /v1/models HTTP/${version}\r\nHost: unknown.example\r\n${extra}\r\n`;
  // Connection: close, and HTTP/1.0 without keep-alive: a 404, then the close at once.
  for (const req of [unknown('GET', '1.1', 'Connection: close\r\n'), unknown('GET', '1.0')]) {
    const t0 = performance.now();
    const r = await rawExchange(act.port, req, { idleMs: 3000 });
    assert.deepEqual(statusCodes(r.text.replace('HTTP/1.0', 'HTTP/1.1')), [404], r.text);
    assert.match(r.text, /\r\nConnection: close\r\n/, r.text);
    assert.ok(r.closed && performance.now() - t0 < 2000, `closed at once: ${r.closed}`);
  }
  // HTTP/1.0 asking for keep-alive keeps it.
  const ka = await rawExchange(act.port, unknown('GET', '1.0', 'Connection: keep-alive\r\n'), { idleMs: 500 });
  assert.match(ka.text, /\r\nConnection: keep-alive\r\n/);
  assert.equal(ka.closed, false);
  // HEAD: the head of the 404 and no body, so the next response on the
  // connection is read from its first byte.
  const head = await rawExchange(act.port, [unknown('HEAD', '1.1'),
    'GET /echo-next HTTP/1.1\r\nHost: echo.local\r\n\r\n'], { idleMs: 800 });
  assert.deepEqual(statusCodes(head.text), [404, 200], head.text);
  const first = head.text.slice(0, head.text.indexOf('HTTP/1.1 200'));
  assert.ok(first.endsWith('\r\n\r\n'), `nothing after the 404's head: ${JSON.stringify(first)}`);
  assert.match(first, /Content-Length: \d+/);
});

test('a backend 204 with a Content-Length reaches the client without it', async () => {
  const r = await rawExchange(act.port, ['GET /no-content HTTP/1.1\r\nHost: echo.local\r\n\r\n',
    'GET /x HTTP/1.1\r\nHost: echo.local\r\n\r\n'], { idleMs: 800 });
  assert.deepEqual(statusCodes(r.text), [204, 200], r.text);
  const first = r.text.slice(0, r.text.indexOf('HTTP/1.1 200'));
  assert.doesNotMatch(first, /content-length/i, first);
});

test('a backend body in a transfer coding other than chunked is a 502, not passed on undecoded and unlabelled', async () => {
  const r = await rawExchange(act.port, ['GET /gzip-te HTTP/1.1\r\nHost: echo.local\r\n\r\n',
    'GET /x HTTP/1.1\r\nHost: echo.local\r\n\r\n'], { idleMs: 800 });
  assert.deepEqual(statusCodes(r.text), [502, 200], r.text);
  assert.match(r.text, /the model server sent an invalid response/);
});

test('a Host named in Connection still reaches the backend', async () => {
  const r = await request(act.port, { path: '/v1/h', headers: { host: 'echo.local', connection: 'keep-alive, Host' } });
  assert.equal(r.status, 200, r.body.toString());
  assert.equal(JSON.parse(r.body).headers.host, 'echo.local');
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

test('client and pooled backend connections get TCP keepalive after 15 s idle, as Go programs set it', async () => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const r = await request(act.port, { path: '/ka', headers: { host: 'echo.local' }, agent });
    assert.equal(r.status, 200);
    // The client's connection is still open (kept alive), and so is the
    // pooled one to the backend.
    for (const [port, side, what] of [[act.port, 'local', 'client'], [echo.port, 'remote', 'backend']]) {
      const socks = await tcpKeepalive(act.proc.pid, port, side);
      for (const s of socks) {
        assert.ok(s.keepaliveInSeconds !== null && s.keepaliveInSeconds <= 15,
          `${what} connection: keepalive probe due within 15 s (Linux's default is 2 h): ${s.line}`);
      }
    }
  } finally {
    agent.destroy();
  }
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

/**
 * startActivator, again if the port freePort() chose was taken before the
 * activator could bind it (other tests on the machine make connections too).
 */
async function startActivatorRetry(config) {
  for (let i = 0; ; i++) {
    try {
      return await startActivator(config);
    } catch (e) {
      if (i === 2 || !/Address already in use/.test(String(e.message))) throw e;
    }
  }
}

/**
 * Writes data in one go, as a client that sends its whole request before
 * reading would, and keeps writing whatever happens; collects the answer
 * until the activator closes. Resolves {text, err}.
 */
function blast(port, data) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const bufs = [];
    let err = null;
    const timer = setTimeout(() => s.destroy(), 20000);
    s.on('data', (d) => bufs.push(d));
    s.on('error', (e) => { err = e.code; });
    s.on('close', () => { clearTimeout(timer); resolve({ text: Buffer.concat(bufs).toString('latin1'), err }); });
    s.on('connect', () => s.write(data));
  });
}

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

  // Several MB sent at once past the limit, by Content-Length (refused at the
  // head) and chunked (refused while streaming, after routing): the answer
  // still arrives, because the activator reads and discards the rest before
  // closing instead of resetting the connection under the client's writes.
  const huge = Buffer.alloc(6 * 1024 * 1024, 'w');
  const byLength = await blast(act.port, Buffer.concat([Buffer.from(
    `POST /v1/completions HTTP/1.1\r\nHost: echo.local\r\nContent-Length: ${huge.length}\r\n\r\n`), huge]));
  assert.deepEqual(statusCodes(byLength.text), [413], `${byLength.err} ${byLength.text.slice(0, 200)}`);
  assert.equal(JSON.parse(rawBody(byLength.text)).error.code, 'request_too_large');
  const hugeChunked = Buffer.concat([
    Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: echo.local\r\nTransfer-Encoding: chunked\r\n\r\n'),
    ...Array.from({ length: 96 }, () => Buffer.from(`10000\r\n${'v'.repeat(65536)}\r\n`)),
    Buffer.from('0\r\n\r\n')]);
  const streamed = await blast(act.port, hugeChunked);
  assert.deepEqual(statusCodes(streamed.text), [413], `${streamed.err} ${streamed.text.slice(0, 200)}`);
  // A bad chunk after the routed start of a large body (found while
  // streaming upstream): 400, read too.
  const start = `{"model":"echo-x","prompt":"${'u'.repeat(2000)}`;
  const badChunk = Buffer.concat([
    Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: echo.local\r\nTransfer-Encoding: chunked\r\n\r\n'),
    Buffer.from(`${start.length.toString(16)}\r\n${start}\r\nzz\r\n`), huge]);
  const bad = await blast(act.port, badChunk);
  assert.deepEqual(statusCodes(bad.text), [400], `${bad.err} ${bad.text.slice(0, 200)}`);
  assert.equal(JSON.parse(rawBody(bad.text)).error.message, 'malformed chunked body');

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
  assert.ok(delta('body_too_large') >= 3);
  assert.ok(delta('bad_request') >= 3);
  assert.equal(delta('header_timeout'), 1);
  // Those closes lingered and ended with the client's own close.
  const lingered = (m, r) => metricSum(m, 'thaw_activator_lingering_closes_total', { result: r });
  await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_lingering_connections') === 0,
    8000, { what: 'no lingering connection left' });
  const end = await act.metrics();
  assert.ok(lingered(end, 'eof') - lingered(before, 'eof') >= 6,
    `lingering closes ended by eof: ${lingered(end, 'eof') - lingered(before, 'eof')}`);
  assert.equal(lingered(end, 'full') - lingered(before, 'full'), 0);
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

test('lingering close is bounded: lingeringTimeout, lingeringTime, lingeringMaxBytes, maxLingeringConnections', async () => {
  const a3 = await startActivatorRetry({
    limits: { maxBodyBytes: 1000, lingeringTimeoutSeconds: 1, lingeringTimeSeconds: 2.5,
      lingeringMaxBytes: 1024 * 1024, maxLingeringConnections: 2 },
    models: [{ name: 'echo', backend: `http://127.0.0.1:${echo.port}`, hosts: ['echo.local'] }],
  });
  const tooBig = 'POST /v1/completions HTTP/1.1\r\nHost: echo.local\r\nContent-Length: 100000000\r\n\r\n';
  const results = async () => {
    const m = await a3.metrics();
    return Object.fromEntries(['eof', 'timeout', 'time', 'bytes', 'error', 'full'].map(
      (r) => [r, metricSum(m, 'thaw_activator_lingering_closes_total', { result: r })]));
  };
  // A client that keeps its side open (half-open allowed: it does not answer
  // our FIN with its own) and does what `then` says after the head.
  const clients = [];
  const client = (then) => {
    const s = net.connect({ port: a3.port, host: '127.0.0.1', allowHalfOpen: true });
    const r = { text: '', fin: 0, t0: Date.now(), s };
    s.on('data', (d) => { r.text += d.toString('latin1'); });
    s.on('end', () => { r.fin = Date.now(); });
    s.on('error', () => {});
    s.on('connect', () => { s.write(tooBig); then(s); });
    clients.push(r);
    return r;
  };
  const lingering = async () => metricSum(await a3.metrics(), 'thaw_activator_lingering_connections');
  // waitUntil on the results, saying what they were if it times out.
  const waitResults = (pred, ms, what) => waitUntil(async () => pred(await results()), ms, { what })
    .catch(async (e) => { throw new Error(`${e.message}; lingering closes: ${JSON.stringify(await results())}`); });
  let trickle = null;
  try {
    // Sends nothing more and never closes: closed lingeringTimeout after our FIN.
    const quiet = client(() => {});
    await waitResults((r) => r.timeout === 1, 5000, 'lingering timeout');
    assert.deepEqual(statusCodes(quiet.text), [413]);
    assert.ok(quiet.fin > 0, 'the answer is followed by our FIN');

    // Keeps trickling bytes (every 100 ms, well within the 1 s lingering
    // timeout even on a busy machine): each restarts the timeout, and
    // lingeringTime ends it.
    const slow = client((sock) => {
      trickle = setInterval(() => { if (!sock.destroyed) sock.write('x'.repeat(10)); }, 100);
    });
    await waitResults((r) => r.time === 1, 8000, 'lingering time');
    clearInterval(trickle);
    assert.deepEqual(statusCodes(slow.text), [413]);
    assert.ok(Date.now() - slow.t0 >= 2400, `lingered ${Date.now() - slow.t0} ms with data coming`);

    // Floods: lingeringMaxBytes ends it.
    client((sock) => { sock.write(Buffer.alloc(4 * 1024 * 1024, 'f')); });
    await waitResults((r) => r.bytes === 1, 5000, 'lingering byte cap');

    // Two linger at once; a third close does not linger (counted full) and
    // is an ordinary close: the answer, then our FIN.
    await waitUntil(async () => (await lingering()) === 0, 3000, { what: 'none lingering' });
    client(() => {});
    await waitUntil(async () => (await lingering()) === 1, 3000, { what: '1 lingering' });
    client(() => {});
    await waitUntil(async () => (await lingering()) === 2, 3000, { what: '2 lingering' });
    const third = client(() => {});
    await waitResults((r) => r.full === 1 && third.fin > 0, 3000, 'third refused');
    assert.deepEqual(statusCodes(third.text), [413]);
    await waitUntil(async () => (await lingering()) === 0, 5000, { what: 'none lingering' });
    const end = await results();
    assert.equal(end.timeout, 3); // the quiet client and the two held ones
    assert.equal(end.eof, 0);
    await assertAccounted(a3);
  } finally {
    clearInterval(trickle);
    for (const c of clients) c.s.destroy();
    await a3.stop();
  }
});

/** Resident and peak resident memory of a process, in bytes. */
function memOf(pid) {
  const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k) => Number(new RegExp(`${k}:\\s+(\\d+) kB`).exec(st)[1]) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

test('send timeout: a client that stops reading a long SSE stream is cut after sendTimeoutSeconds, with its upstream; counted; memory bounded', async (t) => {
  const SEND_MS = 1000;
  const a2 = await startActivatorRetry({
    limits: { sendTimeoutSeconds: SEND_MS / 1000, bufferBytes: 65536 },
    models: [{ name: 'echo', backend: `http://127.0.0.1:${echo.port}`, hosts: ['echo.local'],
      probeInitialMs: 5, probeMaxMs: 20 }],
  });
  try {
    const mem0 = memOf(a2.proc.pid);
    const s = net.connect(a2.port, '127.0.0.1');
    const bufs = [];
    let ended = false;
    let tPause = 0;
    s.on('data', (d) => {
      bufs.push(d);
      // Reads the head and stops: the buffers on the way fill (milliseconds
      // on loopback), then nothing moves.
      if (!tPause && Buffer.concat(bufs).includes('\r\n\r\n')) {
        s.pause();
        tPause = Date.now();
      }
    });
    s.on('error', () => { ended = true; });
    s.on('close', () => { ended = true; });
    s.write('GET /sse-forever HTTP/1.1\r\nHost: echo.local\r\n\r\n');
    await waitUntil(() => tPause > 0, 10000, { what: 'response head' });
    assert.match(Buffer.concat(bufs).toString('latin1'), /^HTTP\/1\.1 200 OK\r\n[^]*text\/event-stream/);
    await waitUntil(() => echo.sse?.closedAt > 0, SEND_MS + 15000, { what: 'upstream connection closed' });
    // About the timeout after the client's last read, not long after. The
    // activator's last write can precede that read a little (the first read
    // may come once the buffers are already full, and a socket is writable
    // again only when a good part of its buffer is free), hence the margin;
    // test_activator_conn measures the timer itself.
    const cutAfter = echo.sse.closedAt - tPause;
    assert.ok(cutAfter >= SEND_MS * 0.8, `cut ${cutAfter} ms after the client stopped reading`);
    assert.ok(cutAfter < SEND_MS + 10000, `cut ${cutAfter} ms after the client stopped reading`);
    t.diagnostic(`cut ${cutAfter} ms after the client stopped reading`);
    const m = await a2.metrics();
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { model: 'echo', outcome: 'send_timeout' }), 1);
    assert.equal(metricSum(m, 'thaw_activator_requests_total', { outcome: 'client_closed' }), 0);
    await waitUntil(async () => metricSum(await a2.metrics(), 'thaw_activator_open_connections') === 0,
      5000, { what: 'client connection closed' });
    // Backpressure held while the client was stuck: the backend could write
    // only what the buffers on the way hold (the activator's bufferBytes and
    // the sockets'), and the activator's peak memory grew by no more, not by
    // a second of stream at loopback speed. (Under ASan, freed memory sits in
    // quarantine, so RSS follows the bytes moved, hence the margin.)
    const mem1 = memOf(a2.proc.pid);
    assert.ok(echo.sse.bytes > 4 * 65536, `backend wrote ${echo.sse.bytes} bytes`);
    assert.ok(echo.sse.bytes < 48 * 1024 * 1024, `backend wrote ${echo.sse.bytes} bytes`);
    assert.ok(mem1.hwm - mem0.hwm < 48 * 1024 * 1024,
      `peak RSS grew by ${((mem1.hwm - mem0.hwm) / 1048576).toFixed(1)} MiB`);
    t.diagnostic(`backend wrote ${echo.sse.bytes} bytes; peak RSS grew by ${mem1.hwm - mem0.hwm} bytes`);
    // The client, reading again, gets what was in flight and then the end of
    // the connection, never the last chunk of a complete response.
    s.resume();
    await waitUntil(() => ended, 5000, { what: 'client sees the connection end' });
    assert.ok(!Buffer.concat(bufs).toString('latin1').endsWith('0\r\n\r\n'), 'the response is not complete');
    await assertAccounted(a2);
  } finally {
    await a2.stop();
  }
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

test('--access-log 1: one event=access line per finished request, with its outcome and times', async () => {
  const coldPort = await freePort();
  const a = await startActivator({
    models: [{ name: 'm1', backend: fv.url, probeInitialMs: 5, probeMaxMs: 20 },
      { name: 'late', backend: `http://127.0.0.1:${coldPort}`, probeInitialMs: 5, probeMaxMs: 20 }],
  }, { args: ['--access-log', '1'] });
  let late = null;
  try {
    assert.equal((await complete(a.port, 'm1')).status, 200); // wakes m1 (held a few ms)
    const ok = await complete(a.port, 'm1', { headers: { 'x-request-id': 'req 42',
      traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } });
    assert.equal(ok.status, 200);
    assert.equal((await complete(a.port, 'nope')).status, 404);
    // Held while its backend comes up.
    const pending = complete(a.port, 'late', { timeoutMs: 10000 });
    await waitUntil(async () => (await a.model('late')).held === 1, 3000, { what: 'held' });
    await sleep(300);
    late = await startFakeVllm({ model: 'late', port: coldPort });
    assert.equal((await pending).status, 200);
    await waitUntil(() => (a.proc.output().match(/event=access /g) ?? []).length >= 4, 3000,
      { what: 'four access lines' });
    const lines = a.proc.output().split('\n').filter((l) => l.includes('event=access '));
    const field = (line, k) => {
      const m = new RegExp(`\\b${k}=("(?:[^"\\\\]|\\\\.)*"|\\S+)`).exec(line);
      return m ? m[1] : undefined;
    };
    assert.equal(lines.length, 4, lines.join('\n'));
    const [l0, l1, l2, l3] = lines;
    assert.ok(Number(field(l0, 'held_ms')) >= 0, `the first request met a cold model: ${l0}`);
    assert.equal(field(l1, 'model'), 'm1');
    assert.equal(field(l1, 'method'), 'POST');
    assert.equal(field(l1, 'target'), '/v1/completions');
    assert.equal(field(l1, 'status'), '200');
    assert.equal(field(l1, 'outcome'), 'ok');
    assert.equal(field(l1, 'client'), '127.0.0.1');
    assert.equal(field(l1, 'endpoint'), fv.url.replace('http://', ''));
    assert.equal(field(l1, 'held_ms'), '-1');
    assert.equal(field(l1, 'request_id'), '"req 42"');
    assert.equal(field(l1, 'trace_id'), '4bf92f3577b34da6a3ce929d0e0e4736');
    assert.ok(Number(field(l1, 'head_ms')) >= 0 && Number(field(l1, 'total_ms')) >= Number(field(l1, 'head_ms')), l1);
    assert.ok(Number(field(l1, 'body_bytes')) > 0, l1);
    assert.equal(field(l2, 'model'), '-');
    assert.equal(field(l2, 'status'), '404');
    assert.equal(field(l2, 'outcome'), 'model_not_found');
    assert.equal(field(l2, 'endpoint'), '-');
    assert.equal(field(l3, 'model'), 'late');
    assert.ok(Number(field(l3, 'held_ms')) >= 300, l3);
    assert.ok(Number(field(l3, 'head_ms')) >= Number(field(l3, 'held_ms')), l3);
    assert.equal(field(l3, 'request_id'), '-');
    assert.equal(field(l3, 'trace_id'), '-');
    // Off by default: the shared activator logs none.
    assert.doesNotMatch(act.proc.output(), /event=access /);
  } finally {
    await a.stop();
    await late?.stop();
  }
});

test('--access-log 1: requests that end without a backend answer get their line too', async () => {
  const deadPort = await freePort();
  const a = await startActivator({
    models: [{ name: 'gone', backend: `http://127.0.0.1:${deadPort}`, holdTimeoutSeconds: 0.5,
      sseHeartbeatSeconds: 0.1, probeInitialMs: 5, probeMaxMs: 20 },
    { name: 'left', backend: `http://127.0.0.1:${deadPort}`, probeInitialMs: 5, probeMaxMs: 20 }],
  }, { args: ['--access-log', '1'] });
  try {
    // The client gives up while its request is held.
    await assert.rejects(complete(a.port, 'left', { timeoutMs: 400 }), /client timeout/);
    // Held until the hold timeout, plain and streaming (an early SSE head).
    assert.equal((await complete(a.port, 'gone')).status, 504);
    const sse = await complete(a.port, 'gone', { stream: true });
    assert.equal(sse.status, 200);
    // A head that is not HTTP.
    const bad = await rawExchange(a.port, 'NOT HTTP AT ALL\r\n\r\n');
    assert.match(bad.text, /^HTTP\/1\.1 400/);
    await waitUntil(() => (a.proc.output().match(/event=access /g) ?? []).length >= 4, 3000,
      { what: 'four access lines' });
    const lines = a.proc.output().split('\n').filter((l) => l.includes('event=access '));
    const field = (line, k) => new RegExp(`\\b${k}=(\\S+)`).exec(line)?.[1];
    const byOutcome = (o) => lines.filter((l) => new RegExp(`outcome=${o}\\b`).test(l));
    const [left] = byOutcome('client_closed');
    assert.ok(left, lines.join('\n'));
    assert.equal(field(left, 'model'), 'left');
    assert.equal(field(left, 'status'), '0');
    assert.ok(Number(field(left, 'held_ms')) >= 300, left);
    const [plain, stream] = byOutcome('hold_timeout');
    assert.equal(field(plain, 'status'), '504');
    assert.ok(Number(field(plain, 'held_ms')) >= 450, plain);
    assert.ok(Number(field(plain, 'head_ms')) >= 450, plain);
    assert.equal(field(stream, 'status'), '200', 'the client had our 200 SSE head');
    assert.ok(Number(field(stream, 'head_ms')) < 400, stream);
    assert.ok(Number(field(stream, 'held_ms')) >= 450, stream);
    const [head] = byOutcome('bad_request');
    assert.equal(field(head, 'model'), '-');
    assert.equal(field(head, 'status'), '400');
    assert.equal(field(head, 'client'), '127.0.0.1');
  } finally {
    await a.stop();
  }
});
