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

/**
 * With `cap` idle connections open on port, one more gets a 503 and is
 * closed; the idle ones still work; closing one lets a scrape in, which sees
 * `<prefix>_connections` and the exact refused count; closing all brings the
 * gauge back to the scrape alone. proc's log must name the event.
 */
export async function checkConnectionCap({ port, cap, prefix, proc, slow = false }) {
  const idle = [];
  try {
    for (let i = 0; i < cap; i++) idle.push(await connect(port));
    const extra = await connect(port);
    const r = await readUntilClosed(extra, slow ? 20000 : 5000);
    extra.destroy();
    assert.ok(r.closed, `connection ${cap + 1} was left open (got ${JSON.stringify(r.text)})`);
    assert.match(r.text, /^HTTP\/1\.1 503 /, 'the connection over the cap is answered 503');
    assert.match(r.text, /too many connections/);

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
    idle[0].write('GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
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

    for (const s of idle) s.destroy();
    const until = Date.now() + (slow ? 30000 : 10000);
    for (;;) {
      const res = await get(port, '/metrics');
      if (res.status === 200 && sample(res.body, `${prefix}_connections`) === 1) break;
      assert.ok(Date.now() < until, 'closed connections are still counted');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.match(proc.output(), /event=http_connections_full .*limit=\d+/);
  } finally {
    for (const s of idle) s.destroy();
  }
}
