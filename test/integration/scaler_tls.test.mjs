// thaw-scaler's gRPC port over TLS and mutual TLS, against real TLS clients:
// grpc-js with credentials.createSsl(ca, key, cert) (what KEDA's enableTLS,
// caCert, tlsClientCert and tlsClientKey amount to) and node:tls for looking
// at the handshake itself (ALPN, the certificate served).
//
// Certificates come from the openssl CLI in a temp dir: a CA, a server
// certificate for IP 127.0.0.1 and DNS localhost, client certificates from the
// same CA and from another one. Two scalers run side by side on real peers
// (redis-server, prometheus): one with TLS only, one requiring client
// certificates. Refusals are checked on both sides: the client's call fails,
// the server counts the reason in /metrics and keeps serving. Rotation
// replaces the files under a running scaler: new connections get the new
// certificate (or CA), a bad file is refused and the old one kept, and a
// StreamIsActive stream opened before keeps working.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { after, before, test } from 'node:test';

import { loadGrpc, startPrometheus, startRedis, tmpDir, waitUntil } from './lib/harness.mjs';
import { firstGoawayCode, sampleValue, scaledObjectRef, sleep, startScaler } from './lib/scaler_env.mjs';

const RELOAD_S = 0.3;

let redis;
let prom;
let dir;
let plainTls;   // scaler with --tls-cert-file/--tls-key-file
let mutualTls;  // scaler with --tls-client-ca-file too
let grpcStatus;
const clients = [];

// ---- certificates ---------------------------------------------------------

function sh(cmd, args, cwd) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, timeout: 30000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];

/** A self-signed CA: files <name>.crt, <name>.key in dir. */
async function makeCA(name) {
  await sh('openssl', ['req', '-x509', ...EC, '-keyout', `${name}.key`, '-out', `${name}.crt`,
    '-subj', `/CN=${name}`, '-days', '2'], dir);
  return { name, crt: path.join(dir, `${name}.crt`), key: path.join(dir, `${name}.key`) };
}

/**
 * A leaf signed by ca: <name>.crt and <name>.key in dir. kind 'server' gets
 * SANs IP:127.0.0.1 and DNS:localhost, 'client' gets clientAuth.
 */
async function makeLeaf(name, ca, { cn, serial, kind }) {
  const ext = kind === 'server'
    ? 'basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
    : 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n';
  fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
  await sh('openssl', ['req', ...EC, '-keyout', `${name}.key`, '-out', `${name}.csr`,
    '-subj', `/CN=${cn}`], dir);
  await sh('openssl', ['x509', '-req', '-in', `${name}.csr`, '-CA', `${ca.name}.crt`,
    '-CAkey', `${ca.name}.key`, '-set_serial', serial, '-days', '2',
    '-extfile', `${name}.ext`, '-out', `${name}.crt`], dir);
  return { crt: path.join(dir, `${name}.crt`), key: path.join(dir, `${name}.key`) };
}

const read = (f) => fs.readFileSync(f);

/** Replaces dest atomically, as a Kubernetes Secret volume update does. */
function replaceFile(src, dest) {
  const tmp = `${dest}.tmp-${process.pid}`;
  fs.copyFileSync(src, tmp);
  fs.renameSync(tmp, dest);
}

// ---- clients ----------------------------------------------------------------

/**
 * A grpc-js client over TLS with its own connection. tlsOpts: {ca, key,
 * cert} (PEM Buffers; key/cert for mutual TLS), authority (server name to
 * check, default: the address's IP).
 */
function tlsClient(port, { ca, key = null, cert = null, authority = null } = {}) {
  const { grpc, ExternalScaler, Health } = loadGrpc();
  const creds = grpc.credentials.createSsl(ca, key, cert);
  const opts = {
    'grpc.use_local_subchannel_pool': 1,
    'grpc.initial_reconnect_backoff_ms': 100,
    'grpc.max_reconnect_backoff_ms': 1000,
  };
  if (authority) {
    opts['grpc.ssl_target_name_override'] = authority;
    opts['grpc.default_authority'] = authority;
  }
  const address = `127.0.0.1:${port}`;
  const scaler = new ExternalScaler(address, creds, opts);
  const health = new Health(address, creds, { ...opts, channelOverride: scaler.getChannel() });
  const deadline = () => ({ deadline: Date.now() + 5000 });
  const unary = (client, method, req) => new Promise((resolve, reject) => {
    client[method](req, new grpc.Metadata(), deadline(), (err, res) => (err ? reject(err) : resolve(res)));
  });
  const c = {
    isActive: (ref) => unary(scaler, 'IsActive', ref),
    getMetricSpec: (ref) => unary(scaler, 'GetMetricSpec', ref),
    getMetrics: (req) => unary(scaler, 'GetMetrics', req),
    healthCheck: (service = '') => unary(health, 'Check', { service }),
    /** StreamIsActive collector: messages, error, waitFor(pred, ms), cancel(). */
    streamIsActive: (ref) => {
      const call = scaler.StreamIsActive(ref);
      const s = { messages: [], error: null, ended: false };
      let cancelled = false;
      const waiters = new Set();
      const notify = () => { for (const w of [...waiters]) w(); };
      call.on('data', (m) => { s.messages.push(m); notify(); });
      call.on('error', (e) => { if (!cancelled) s.error = e; s.ended = true; notify(); });
      call.on('end', () => { s.ended = true; notify(); });
      s.cancel = () => { cancelled = true; call.cancel(); };
      s.waitFor = (pred, ms = 5000) => new Promise((resolve, reject) => {
        const check = () => {
          const m = s.messages.find(pred);
          if (m) { done(); resolve(m); } else if (s.ended) {
            done();
            reject(s.error ?? new Error('stream ended'));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no matching message within ${ms} ms: ${JSON.stringify(s.messages)}`));
        }, ms);
        const done = () => { clearTimeout(timer); waiters.delete(check); };
        waiters.add(check);
        check();
      });
      return s;
    },
    close: () => scaler.close(),
  };
  clients.push(c);
  return c;
}

/** A cleartext (prior-knowledge HTTP/2) grpc-js client, its own connection. */
function cleartextClient(port) {
  const { grpc, ExternalScaler } = loadGrpc();
  const scaler = new ExternalScaler(`127.0.0.1:${port}`, grpc.credentials.createInsecure(),
    { 'grpc.use_local_subchannel_pool': 1 });
  clients.push({ close: () => scaler.close() });
  return {
    close: () => scaler.close(),
    isActive: (ref) => new Promise((resolve, reject) => {
      scaler.IsActive(ref, new grpc.Metadata(), { deadline: Date.now() + 3000 },
        (err, res) => (err ? reject(err) : resolve(res)));
    }),
  };
}

/**
 * A raw node:tls handshake with the scaler. Resolves to {alpn, cert (peer
 * certificate: subject.CN, serialNumber), authorized} or rejects with the
 * handshake error. The socket is closed either way.
 */
function handshake(port, { ca, key, cert, alpn = ['h2'], servername = 'localhost' } = {}) {
  return new Promise((resolve, reject) => {
    const opts = { host: '127.0.0.1', port, ca, key, cert, servername, rejectUnauthorized: true };
    if (alpn) opts.ALPNProtocols = alpn;
    const s = tls.connect(opts, () => {
      const out = { alpn: s.alpnProtocol, cert: s.getPeerCertificate(), authorized: s.authorized };
      // TLS 1.3: the server checks a client certificate after the client
      // thinks the handshake is done; a refusal then arrives as an alert.
      s.once('error', reject);
      s.once('close', () => reject(new Error('closed by the server after the handshake')));
      setTimeout(() => { s.removeAllListeners('close'); s.destroy(); resolve(out); }, 300);
    });
    s.once('error', reject);
    s.setTimeout(5000, () => { s.destroy(); reject(new Error('handshake timed out')); });
  });
}

/** Asserts that promise rejects; returns the error. */
async function rejects(promise, what) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail(`${what}: expected a failure, it succeeded`);
}

async function failures(scaler, reason) {
  return sampleValue(await scaler.metrics(), 'thaw_scaler_tls_handshake_failures_total', { reason });
}

/** Waits until the scaler counts one more failure with this reason than `before`. */
async function waitFailure(scaler, reason, before, what) {
  await waitUntil(async () => (await failures(scaler, reason)) > before, 5000,
    { intervalMs: 50, what: `${what}: tls_handshake_failures_total{reason="${reason}"} > ${before}` });
}

// ---- setup --------------------------------------------------------------------

let ca;
let otherCa;
let server;
let client;
let strangerClient;

before(async () => {
  dir = tmpDir('thaw-tls-');
  [ca, otherCa] = await Promise.all([makeCA('ca'), makeCA('other-ca')]);
  [server, client, strangerClient] = await Promise.all([
    makeLeaf('server', ca, { cn: 'thaw-scaler-1', serial: '0x1001', kind: 'server' }),
    makeLeaf('client', ca, { cn: 'keda-operator', serial: '0x2001', kind: 'client' }),
    makeLeaf('stranger', otherCa, { cn: 'keda-operator', serial: '0x3001', kind: 'client' }),
  ]);
  // Each scaler gets its own copies: the rotation tests replace them.
  for (const sub of ['plain', 'mutual']) {
    fs.mkdirSync(path.join(dir, sub));
    fs.copyFileSync(server.crt, path.join(dir, sub, 'tls.crt'));
    fs.copyFileSync(server.key, path.join(dir, sub, 'tls.key'));
    fs.copyFileSync(ca.crt, path.join(dir, sub, 'ca.crt'));
  }
  [redis, prom] = await Promise.all([startRedis(), startPrometheus({ scrapeTargets: [] })]);
  const common = { prometheusUrl: prom.url, redisUrl: redis.url };
  const tlsFlags = (sub) => ({
    'tls-cert-file': path.join(dir, sub, 'tls.crt'),
    'tls-key-file': path.join(dir, sub, 'tls.key'),
    'tls-reload-interval-seconds': RELOAD_S,
    'log-level': 'debug',
  });
  [plainTls, mutualTls] = await Promise.all([
    startScaler({ ...common, name: 'scaler-tls', flags: tlsFlags('plain') }),
    startScaler({
      ...common,
      name: 'scaler-mtls',
      flags: { ...tlsFlags('mutual'), 'tls-client-ca-file': path.join(dir, 'mutual', 'ca.crt') },
    }),
  ]);
  grpcStatus = loadGrpc().grpc.status;
});

after(async () => {
  for (const c of clients) c.close();
  for (const s of [plainTls, mutualTls]) {
    if (!s) continue;
    const code = await s.stop();
    assert.equal(code, 0, `${s.proc.name} exit code; output:\n${s.proc.output().slice(-3000)}`);
  }
});

// ---- TLS ----------------------------------------------------------------------

test('TLS: the listening line says so, and ALPN h2 with our certificate is served', async () => {
  await plainTls.proc.waitForLog(/event=listening grpc_port=\d+ http_port=\d+ tls=on /, 1000);
  await mutualTls.proc.waitForLog(/event=listening grpc_port=\d+ http_port=\d+ tls=mutual /, 1000);
  await plainTls.proc.waitForLog(/event=tls_certificate_loaded subject="\/CN=thaw-scaler-1" serial=1001 /, 1000);
  const h = await handshake(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.equal(h.alpn, 'h2');
  assert.equal(h.authorized, true);
  assert.equal(h.cert.subject.CN, 'thaw-scaler-1');
  assert.equal(h.cert.serialNumber, '1001');
});

test('TLS: IsActive, GetMetricSpec, GetMetrics, Health over TLS (IP and DNS names)', async () => {
  const before = sampleValue(await plainTls.metrics(), 'thaw_scaler_tls_handshakes_total');
  for (const [i, authority] of [null, 'localhost'].entries()) {
    const c = tlsClient(plainTls.grpcPort, { ca: read(ca.crt), authority });
    const model = `tls-model-${i}`;
    const ref = scaledObjectRef(`tls-so-${i}`, { model, targetQueueLength: '5' });
    assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
    assert.deepEqual(await c.isActive(ref), { result: false });
    const spec = await c.getMetricSpec(ref);
    assert.equal(spec.metricSpecs[0].metricName, `thaw-${model}`);
    await redis.cli('RPUSH', `thaw:queue:${model}`, 'a', 'b', 'c', 'd', 'e', 'f', 'g');
    await waitUntil(async () => {
      const r = await c.getMetrics({ scaledObjectRef: ref, metricName: `thaw-${model}` });
      return r.metricValues[0].metricValueFloat === 2;
    }, 5000, { what: 'GetMetrics over TLS reports 2 replicas for 7 jobs / 5' });
    assert.deepEqual(await c.isActive(ref), { result: true });
    await redis.cli('DEL', `thaw:queue:${model}`);
    c.close();
  }
  const after = sampleValue(await plainTls.metrics(), 'thaw_scaler_tls_handshakes_total');
  assert.ok(after >= before + 2, `handshakes counted: ${before} -> ${after}`);
});

test('TLS: a client that does not trust the server CA fails', async () => {
  const c = tlsClient(plainTls.grpcPort, { ca: read(otherCa.crt) });
  const err = await rejects(c.healthCheck(''), 'Health/Check with the wrong CA');
  c.close();
  assert.equal(err.code, grpcStatus.UNAVAILABLE, `${err.code}: ${err.details}`);
  const e2 = await rejects(handshake(plainTls.grpcPort, { ca: read(otherCa.crt) }), 'node:tls, wrong CA');
  assert.match(e2.code ?? e2.message, /UNABLE_TO_VERIFY|SELF_SIGNED|CERT/i);
  // The name is checked too: the certificate is not for another host.
  const e3 = await rejects(handshake(plainTls.grpcPort, { ca: read(ca.crt), servername: 'example.com' }),
    'node:tls, wrong name');
  assert.match(e3.code ?? e3.message, /ERR_TLS_CERT_ALTNAME_INVALID/);
});

test('TLS: a bad client preface is answered with a GOAWAY through TLS, then the close', async () => {
  // HTTP/1.1 inside a TLS session that agreed on h2: nghttp2 refuses the
  // preface and leaves the GOAWAY to the server (frame errors after a good
  // preface get nghttp2's own).
  const bad = Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  const { got, closed } = await new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port: plainTls.grpcPort, ca: read(ca.crt),
      servername: 'localhost', ALPNProtocols: ['h2'] }, () => s.write(bad));
    let data = Buffer.alloc(0);
    s.on('data', (d) => { data = Buffer.concat([data, d]); });
    s.on('close', () => resolve({ got: data, closed: true }));
    s.on('error', () => {});
    s.setTimeout(5000, () => { s.destroy(); resolve({ got: data, closed: false }); });
    s.once('error', reject);
  });
  assert.ok(closed, 'the server closed the connection');
  assert.equal(firstGoawayCode(got), 1 /* PROTOCOL_ERROR */,
    `GOAWAY PROTOCOL_ERROR inside TLS; got ${got.toString('hex').slice(0, 120)}`);
  const c = tlsClient(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
  c.close();
});

test('TLS: a cleartext client fails, is counted, and the server keeps serving', async () => {
  const before = await failures(plainTls, 'not_tls');
  const ref = scaledObjectRef('clear-so', { model: 'clear' });
  const clear = cleartextClient(plainTls.grpcPort);
  const err = await rejects(clear.isActive(ref), 'cleartext IsActive');
  clear.close();
  assert.equal(err.code, grpcStatus.UNAVAILABLE, `${err.code}: ${err.details}`);
  await waitFailure(plainTls, 'not_tls', before, 'cleartext HTTP/2');
  await plainTls.proc.waitForLog(/event=tls_handshake_failed peer=127\.0\.0\.1:\d+ reason=not_tls detail=/, 2000);
  const c = tlsClient(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.deepEqual(await c.isActive(ref), { result: false });
  // HTTP/1.1 on the TLS port: the same refusal, nothing answered in cleartext.
  const got = await new Promise((resolve) => {
    const s = net.connect(plainTls.grpcPort, '127.0.0.1', () => s.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    let data = Buffer.alloc(0);
    s.on('data', (d) => { data = Buffer.concat([data, d]); });
    s.on('close', () => resolve(data));
    s.on('error', () => {});
    s.setTimeout(5000, () => s.destroy());
  });
  assert.ok(!got.toString('latin1').includes('HTTP/1.1'), `no HTTP answer: ${JSON.stringify(got.toString('latin1'))}`);
  await waitFailure(plainTls, 'not_tls', before + 1, 'HTTP/1.1 request');
});

test('TLS: handshakes without ALPN h2 are refused with no_application_protocol', async () => {
  const before = await failures(plainTls, 'no_alpn_h2');
  const e1 = await rejects(handshake(plainTls.grpcPort, { ca: read(ca.crt), alpn: null }), 'no ALPN');
  assert.match(e1.message, /no application protocol/i);
  const e2 = await rejects(handshake(plainTls.grpcPort, { ca: read(ca.crt), alpn: ['http/1.1'] }),
    'ALPN http/1.1 only');
  assert.match(e2.message, /no application protocol/i);
  // A client offering both gets h2.
  const h = await handshake(plainTls.grpcPort, { ca: read(ca.crt), alpn: ['http/1.1', 'h2'] });
  assert.equal(h.alpn, 'h2');
  await waitFailure(plainTls, 'no_alpn_h2', before + 1, 'no ALPN and http/1.1');
  await plainTls.proc.waitForLog(/event=tls_handshake_failed .*reason=no_alpn_h2 detail="client offered no ALPN/, 1000);
});

test('TLS: TLS 1.1 is refused', async () => {
  const before = await failures(plainTls, 'protocol_version');
  await rejects(new Promise((resolve, reject) => {
    const s = tls.connect({
      host: '127.0.0.1', port: plainTls.grpcPort, ca: read(ca.crt), servername: 'localhost',
      ALPNProtocols: ['h2'], minVersion: 'TLSv1', maxVersion: 'TLSv1.1', ciphers: 'DEFAULT@SECLEVEL=0',
    }, () => { s.destroy(); resolve(); });
    s.on('error', reject);
  }), 'TLS 1.1 handshake');
  await waitFailure(plainTls, 'protocol_version', before, 'TLS 1.1');
});

// ---- mutual TLS ---------------------------------------------------------------

test('mTLS: a client certificate from the CA is accepted on every RPC', async () => {
  const c = tlsClient(mutualTls.grpcPort, { ca: read(ca.crt), key: read(client.key), cert: read(client.crt) });
  const ref = scaledObjectRef('mtls-so', { model: 'mtls-model' });
  assert.deepEqual(await c.healthCheck('externalscaler.ExternalScaler'), { status: 'SERVING' });
  assert.deepEqual(await c.isActive(ref), { result: false });
  const m = await c.getMetrics({ scaledObjectRef: ref, metricName: '' });
  assert.equal(m.metricValues[0].metricName, 'thaw-mtls-model');
  await mutualTls.proc.waitForLog(/event=tls_handshake peer=\S+ version=TLSv1\.3 .*client="\/CN=keda-operator"/, 2000);
});

test('mTLS: no client certificate is refused', async () => {
  const before = await failures(mutualTls, 'client_cert_missing');
  const c = tlsClient(mutualTls.grpcPort, { ca: read(ca.crt) });
  const err = await rejects(c.isActive(scaledObjectRef('x', { model: 'x' })), 'IsActive without a client cert');
  c.close();
  assert.equal(err.code, grpcStatus.UNAVAILABLE, `${err.code}: ${err.details}`);
  await waitFailure(mutualTls, 'client_cert_missing', before, 'no client certificate');
  await mutualTls.proc.waitForLog(/event=tls_handshake_failed .*reason=client_cert_missing detail="peer did not return a certificate"/, 1000);
});

test('mTLS: a client certificate from another CA is refused', async () => {
  const before = await failures(mutualTls, 'client_cert_rejected');
  const c = tlsClient(mutualTls.grpcPort,
    { ca: read(ca.crt), key: read(strangerClient.key), cert: read(strangerClient.crt) });
  const err = await rejects(c.isActive(scaledObjectRef('x', { model: 'x' })), 'IsActive with a stranger cert');
  c.close();
  assert.equal(err.code, grpcStatus.UNAVAILABLE, `${err.code}: ${err.details}`);
  await waitFailure(mutualTls, 'client_cert_rejected', before, 'client cert from another CA');
  await mutualTls.proc.waitForLog(/event=tls_handshake_failed .*reason=client_cert_rejected detail="certificate verify failed: unable to get local issuer certificate"/, 1000);
  // The server still serves the right client.
  const ok = tlsClient(mutualTls.grpcPort, { ca: read(ca.crt), key: read(client.key), cert: read(client.crt) });
  assert.deepEqual(await ok.healthCheck(''), { status: 'SERVING' });
});

// ---- rotation -----------------------------------------------------------------

test('rotation: a bad file is refused and the old certificate kept; a new one is used by new connections while an open stream keeps working', async () => {
  const certPath = path.join(dir, 'plain', 'tls.crt');
  const keyPath = path.join(dir, 'plain', 'tls.key');
  const ref = scaledObjectRef('rot-so', { model: 'rot-model' });
  const c = tlsClient(plainTls.grpcPort, { ca: read(ca.crt) });
  const stream = c.streamIsActive(ref);
  await waitUntil(async () => sampleValue(await plainTls.metrics(), 'thaw_scaler_active_streams') >= 1,
    5000, { what: 'the stream is open on the server' });

  // 1. Garbage written in place: logged, counted, the old certificate stays.
  let mark = plainTls.proc.mark();
  fs.writeFileSync(certPath, '-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n');
  await plainTls.proc.waitForLog(/event=tls_reload_failed error=".*tls\.crt.*" keeping=previous_certificate/, 5000, { since: mark });
  assert.equal(sampleValue(await plainTls.metrics(), 'thaw_scaler_tls_certificate_reloads_total', { result: 'error' }) >= 1, true);
  let h = await handshake(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.equal(h.cert.serialNumber, '1001', 'the old certificate is still served');

  // 2. A key that does not match the (restored) certificate: refused too.
  const next = await makeLeaf('server2', ca, { cn: 'thaw-scaler-2', serial: '0x1002', kind: 'server' });
  mark = plainTls.proc.mark();
  replaceFile(server.crt, certPath);
  replaceFile(next.key, keyPath);
  await plainTls.proc.waitForLog(/event=tls_reload_failed error="private key .* does not match certificate/, 5000, { since: mark });
  h = await handshake(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.equal(h.cert.serialNumber, '1001');

  // 2b. A passphrase-protected key: refused as such. No passphrase is asked
  // for (OpenSSL's default prompt reads stdin, blocking the event loop).
  const encKey = path.join(dir, 'server2-enc.key');
  await sh('openssl', ['pkey', '-in', next.key, '-aes256', '-passout', 'pass:secret', '-out', encKey], dir);
  mark = plainTls.proc.mark();
  replaceFile(encKey, keyPath);
  await plainTls.proc.waitForLog(/event=tls_reload_failed error="private key \S+ is encrypted: give the key without a passphrase/, 5000, { since: mark });
  assert.doesNotMatch(plainTls.proc.output(), /pass phrase/i);
  h = await handshake(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.equal(h.cert.serialNumber, '1001');
  mark = plainTls.proc.mark();
  replaceFile(next.key, keyPath);
  await plainTls.proc.waitForLog(/event=tls_reload_failed error="private key .* does not match certificate/, 5000, { since: mark });

  // 3. The matching certificate arrives: new connections get it.
  mark = plainTls.proc.mark();
  replaceFile(next.crt, certPath);
  await plainTls.proc.waitForLog(/event=tls_certificate_reloaded subject="\/CN=thaw-scaler-2" serial=1002 /, 5000, { since: mark });
  h = await handshake(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.equal(h.cert.subject.CN, 'thaw-scaler-2');
  assert.equal(h.cert.serialNumber, '1002');
  assert.equal(h.alpn, 'h2');
  const fresh = tlsClient(plainTls.grpcPort, { ca: read(ca.crt) });
  assert.deepEqual(await fresh.isActive(ref), { result: false });
  assert.ok(sampleValue(await plainTls.metrics(), 'thaw_scaler_tls_certificate_reloads_total', { result: 'ok' }) >= 1);

  // 4. The stream opened under the old certificate is still live: a queue
  // appearing for its model is pushed on it.
  assert.equal(stream.error, null, `stream error: ${stream.error?.message}`);
  await redis.cli('RPUSH', 'thaw:queue:rot-model', 'job');
  await stream.waitFor((m) => m.result === true, 5000);
  assert.equal(stream.error, null);
  assert.deepEqual(await c.isActive(ref), { result: true }, 'the old connection still answers unary calls');
  stream.cancel();
  await redis.cli('DEL', 'thaw:queue:rot-model');
});

test('rotation: a new client CA bundle applies to new connections; open ones stay', async () => {
  const caPath = path.join(dir, 'mutual', 'ca.crt');
  const oldClient = tlsClient(mutualTls.grpcPort, { ca: read(ca.crt), key: read(client.key), cert: read(client.crt) });
  const ref = scaledObjectRef('carot-so', { model: 'carot-model' });
  const stream = oldClient.streamIsActive(ref);
  assert.deepEqual(await oldClient.isActive(ref), { result: false });

  const mark = mutualTls.proc.mark();
  replaceFile(otherCa.crt, caPath);
  await mutualTls.proc.waitForLog(/event=tls_certificate_reloaded .*client_cas=1 /, 5000, { since: mark });
  // Clients of the old CA are now refused on new connections...
  const before = await failures(mutualTls, 'client_cert_rejected');
  const refused = tlsClient(mutualTls.grpcPort, { ca: read(ca.crt), key: read(client.key), cert: read(client.crt) });
  const err = await rejects(refused.isActive(ref), 'old-CA client after the CA rotation');
  refused.close();
  assert.equal(err.code, grpcStatus.UNAVAILABLE);
  await waitFailure(mutualTls, 'client_cert_rejected', before, 'old-CA client after rotation');
  // ...those of the new one accepted...
  const stranger = tlsClient(mutualTls.grpcPort,
    { ca: read(ca.crt), key: read(strangerClient.key), cert: read(strangerClient.crt) });
  assert.deepEqual(await stranger.isActive(ref), { result: false });
  // ...and the connection opened before keeps its stream and its calls.
  await redis.cli('RPUSH', 'thaw:queue:carot-model', 'job');
  await stream.waitFor((m) => m.result === true, 5000);
  assert.deepEqual(await oldClient.isActive(ref), { result: true });
  assert.equal(stream.error, null);
  stream.cancel();
  await redis.cli('DEL', 'thaw:queue:carot-model');
  await sleep(50);
});
