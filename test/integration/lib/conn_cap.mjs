// The connection cap of an evhttp port (common/http_conn_cap), checked the
// same way on thaw-scaler's HTTP port and thaw-activator's admin port.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';

function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1' }, () => resolve(s));
    s.once('error', reject);
  });
}

/** Everything the server sends until it closes the connection (or timeoutMs passes). */
function readUntilClosed(sock, timeoutMs) {
  return new Promise((resolve) => {
    const chunks = [];
    const done = (closed) => {
      clearTimeout(timer);
      resolve({ text: Buffer.concat(chunks).toString(), closed });
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    sock.on('data', (d) => chunks.push(d));
    sock.once('end', () => done(true));
    sock.once('close', () => done(true));
    sock.once('error', () => done(true));
  });
}

/** A GET on a fresh connection; resolves {status, body}. */
function get(port, path) {
  return new Promise((resolve, reject) => {
    const req = http.get({ port, host: '127.0.0.1', path, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (d) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.setTimeout(10000, () => req.destroy(new Error(`GET ${path}: timeout`)));
  });
}

function sample(text, name) {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

// The server evicts a connection silent for this long when it needs room
// (HTTP_CONN_CAP_EVICT_IDLE_MS).
const EVICT_IDLE_MS = 2000;

/**
 * With `cap` connections open on port, all in use or used within the last
 * 2 s, one more gets a 503 and is closed; the open ones still work; closing
 * one lets a scrape in, which sees `<prefix>_connections` and the exact
 * refused count; closing all brings the gauge back to the scrape alone.
 * Then, with `cap` connections idle for longer than 2 s, a new one is
 * served and the least recently active idle one is closed instead
 * (`<prefix>_connections_evicted_total`). proc's log must name the event.
 */
export async function checkConnectionCap({ port, cap, prefix, proc, slow = false }) {
  const idle = [];
  try {
    // Fresh connections, never used: too recent to be evicted (a request's
    // bytes may be on their way).
    for (let i = 0; i < cap; i++) idle.push(await connect(port));
    const extra = await connect(port);
    const r = await readUntilClosed(extra, slow ? 20000 : 5000);
    extra.destroy();
    assert.ok(r.closed, `connection ${cap + 1} was left open (got ${JSON.stringify(r.text)})`);
    assert.match(r.text, /^HTTP\/1\.1 503 /, 'the connection over the cap is answered 503');
    assert.match(r.text, /too many connections/);
    // From here on the open ones are in use, however long the steps take: a
    // request line started and not finished sits in the server's input.
    for (const sock of idle) sock.write('GET /heal');

    // Clients that send their request as they connect while the server is
    // busy (here: stopped): it accepts them with the request already in the
    // socket and must refuse them before evhttp reads and serves it (a
    // settle step deferred by a timer answered them 200). The cap also reads
    // and drops such a request before closing, or the kernel would send a
    // reset that can discard the 503 on a real network; on loopback the 503
    // arrives before the reset, so this does not check that part.
    const BURST = 20;
    proc.proc.kill('SIGSTOP');
    const continued = new Promise((resolve) => setTimeout(() => { proc.proc.kill('SIGCONT'); resolve(); }, 300));
    const burst = await Promise.all(Array.from({ length: BURST }, () => new Promise((resolve) => {
      const chunks = [];
      const sock = net.connect({ port, host: '127.0.0.1' });
      sock.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n');
      const timer = setTimeout(() => { sock.destroy(); resolve('timeout'); }, slow ? 20000 : 5000);
      sock.on('data', (d) => chunks.push(d));
      sock.once('error', (e) => { clearTimeout(timer); resolve(`error ${e.code}`); });
      sock.once('close', () => { clearTimeout(timer); resolve(Buffer.concat(chunks).toString().split('\r\n')[0]); });
    })));
    await continued;
    assert.deepEqual(burst.filter((x) => x !== 'HTTP/1.1 503 Service Unavailable'), [],
      'every connection over the cap that sent a request gets the 503');

    // Connections under the cap are untouched: one of them still gets answers.
    const answered = readUntilClosed(idle[0], 2000);
    idle[0].write('thz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const h = await answered;
    assert.match(h.text, /^HTTP\/1\.1 200 /, `an idle connection under the cap is served: ${h.text}`);

    // idle[0] is closing; a scrape gets in once the server has seen it go.
    let refusedSeen = 1 + BURST;
    let text;
    const deadline = Date.now() + (slow ? 30000 : 10000);
    for (;;) {
      const res = await get(port, '/metrics');
      if (res.status === 200) {
        text = res.body;
        break;
      }
      assert.equal(res.status, 503, `scrape: ${res.status} ${res.body}`);
      refusedSeen++;
      assert.ok(Date.now() < deadline, 'a closed connection never freed its place under the cap');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(sample(text, `${prefix}_connections_refused_total`), refusedSeen,
      'every connection answered 503 is counted');
    assert.equal(sample(text, `${prefix}_connections`), cap, `${cap - 1} idle ones and the scrape`);
    assert.equal(sample(text, `${prefix}_connections_evicted_total`), 0, 'connections in use are never evicted');

    for (const s of idle) s.destroy();
    const until = Date.now() + (slow ? 30000 : 10000);
    for (;;) {
      const res = await get(port, '/metrics');
      if (res.status === 200 && sample(res.body, `${prefix}_connections`) === 1) break;
      assert.ok(Date.now() < until, 'closed connections are still counted');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.match(proc.output(), /event=http_connections_full .*limit=\d+ action=refuse /);
    await checkIdleEviction({ port, cap, prefix, proc, refused: refusedSeen, slow });
  } finally {
    for (const s of idle) s.destroy();
  }
}

/** Watches a socket for the server's close; `closed` turns true on it. */
function watchClose(sock) {
  const w = { closed: false, data: '' };
  sock.on('data', (d) => { w.data += d; });
  sock.once('end', () => { w.closed = true; });
  sock.once('close', () => { w.closed = true; });
  sock.once('error', () => { w.closed = true; });
  return w;
}

async function checkIdleEviction({ port, cap, prefix, proc, refused, slow }) {
  assert.ok(cap >= 4, 'the eviction check needs a cap of 4 or more');
  const socks = [];
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const within = slow ? 20000 : 5000;
  try {
    // The least recently active first: socks[1] stalls in its request line
    // (bytes the server cannot parse yet), socks[2] after whole header lines
    // (parsed, so its buffers are empty): both are in use, not idle.
    for (let i = 0; i < cap; i++) {
      socks.push(await connect(port));
      if (i === 1) socks[1].write('GET /heal');
      if (i === 2) socks[2].write('GET /healthz HTTP/1.1\r\nHost: x\r\n');
      if (i >= 1 && i <= 2) await sleep(100);
    }
    const victim = 3;
    const watched = socks.map(watchClose);
    await sleep(EVICT_IDLE_MS + 500);
    // socks[0] is used (a keep-alive request): the most recently active now,
    // so socks[3] is the least recently active idle one.
    const keepAlive = async () => {
      const before = watched[0].data.length;
      socks[0].write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      const until = Date.now() + within;
      while (!/\r\n\r\nok\n$/.test(watched[0].data.slice(before))) {
        assert.ok(Date.now() < until && !watched[0].closed, `keep-alive request unanswered: ${JSON.stringify(watched[0].data)}`);
        await sleep(20);
      }
    };
    await keepAlive();
    const res = await get(port, '/metrics');
    assert.equal(res.status, 200, `with an idle connection to close, a new one is served: ${res.status} ${res.body}`);
    assert.equal(sample(res.body, `${prefix}_connections_evicted_total`), 1, 'one idle connection made room');
    assert.equal(sample(res.body, `${prefix}_connections_refused_total`), refused, 'nothing refused');
    const closedBy = Date.now() + within;
    while (!watched[victim].closed) {
      assert.ok(Date.now() < closedBy, 'the evicted connection was not closed');
      await sleep(20);
    }
    assert.equal(watched[victim].data, '', 'an evicted idle connection is closed without an answer');
    await sleep(200);
    assert.deepEqual(watched.map((w) => w.closed), socks.map((_, i) => i === victim),
      'only the least recently active idle connection is closed, not the ones in a request');

    // The evicted connection gave its place back: the count comes down to
    // the cap - 1 left and a scrape, with no second eviction (socks[0] is
    // kept recent, the others are in use).
    await keepAlive();
    const until = Date.now() + within;
    for (;;) {
      const r = await get(port, '/metrics');
      assert.equal(r.status, 200, `scrape: ${r.status} ${r.body}`);
      assert.equal(sample(r.body, `${prefix}_connections_evicted_total`), 1, 'no second eviction');
      if (sample(r.body, `${prefix}_connections`) === cap) break;
      assert.ok(Date.now() < until, `the evicted connection still counts: ${sample(r.body, `${prefix}_connections`)} open`);
      await sleep(100);
    }
    // With every place in use (the freed one taken again) and none idle, one
    // more is refused again.
    await sleep(200); // the last scrape's connection has closed
    socks.push(await connect(port));
    socks.at(-1).write('GET /heal');
    const extra = await connect(port);
    const r = await readUntilClosed(extra, within);
    extra.destroy();
    assert.match(r.text, /^HTTP\/1\.1 503 /, `with none idle, one over the cap is refused: ${JSON.stringify(r.text)}`);
    assert.match(proc.output(), /event=http_connections_full .*action=evict /);
  } finally {
    for (const s of socks) s.destroy();
  }
}
