// The example's TLS path, for real: the nginx.conf of the thaw-scaler-tls
// ConfigMap (manifests/examples/llama/scaler-tls.yaml), with only addresses
// and file paths made local, run by Debian's nginx in front of the real
// thaw-scaler; a grpc-js client configured like KEDA for the qwen-7b
// ScaledObject (enableTLS, caCert, tlsClientCert, tlsClientKey, checking the
// server name thaw-scaler-tls.thaw-system) calls through it. Certificates
// come from openssl. Also: a wake pushed on StreamIsActive crosses the proxy
// at once, and a client without a certificate is refused.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import {
  binPath, canConnect, freePort, loadGrpc, spawnProcess, startRedis, tmpDir, waitUntil,
} from './lib/harness.mjs';
import { buildKustomization, manifestsDir } from './manifests_lib.mjs';

const NGINX = '/usr/sbin/nginx';
const SERVER_NAME = 'thaw-scaler-tls.thaw-system';

const objs = buildKustomization(path.join(manifestsDir, 'examples', 'llama'));
const find = (kind, name) => objs.find((o) => o.kind === kind && o.metadata.name === name);

function sh(cmd, args, cwd) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, timeout: 30000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout + stderr);
    });
  });
}

// A CA, a server certificate for SERVER_NAME and a client certificate, all
// signed by that CA (KEDA's caCert / tlsClientCert / tlsClientKey, and the
// proxy's tls.crt / tls.key / ca.crt Secret).
async function makeCerts(dir) {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  await sh('openssl', ['req', '-x509', '-new', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt',
    '-subj', '/CN=thaw-test-ca', '-days', '1'], dir);
  for (const [name, cn, ext] of [['tls', SERVER_NAME, `subjectAltName=DNS:${SERVER_NAME}\nextendedKeyUsage=serverAuth\n`],
    ['client', 'keda-operator', 'extendedKeyUsage=clientAuth\n']]) {
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
    await sh('openssl', ['req', '-new', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`], dir);
    await sh('openssl', ['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key',
      '-CAcreateserial', '-out', `${name}.crt`, '-days', '1', '-extfile', `${name}.ext`], dir);
  }
}

function replaceOnce(text, from, to) {
  assert.ok(text.includes(from), `nginx.conf no longer contains '${from}'`);
  return text.split(from).join(to);
}

let redis;
let scaler;
let nginx;
let dir;
let tlsPort;
let client;

before(async () => {
  dir = tmpDir('thaw-tls-');
  await makeCerts(dir);
  redis = await startRedis();
  const dead = await freePort();
  scaler = await spawnProcess(binPath('thaw-scaler'), ['--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--prometheus-url', `http://127.0.0.1:${dead}`, '--redis-url', redis.url], {
    name: 'thaw-scaler', readyLogRegex: /event=listening grpc_port=\d+/, timeoutMs: 15000,
  });
  const grpcPort = Number((await scaler.waitForLog(/event=listening grpc_port=(\d+)/))[1]);

  tlsPort = await freePort();
  const healthPort = await freePort();
  let conf = find('ConfigMap', 'thaw-scaler-tls').data['nginx.conf'];
  conf = replaceOnce(conf, 'server thaw-scaler.thaw-system.svc:9090;', `server 127.0.0.1:${grpcPort};`);
  conf = replaceOnce(conf, 'listen 9443 ssl http2;', `listen 127.0.0.1:${tlsPort} ssl http2;`);
  conf = replaceOnce(conf, 'listen 8081;', `listen 127.0.0.1:${healthPort};`);
  conf = replaceOnce(conf, '/tmp/', `${dir}/`);
  conf = replaceOnce(conf, '/etc/thaw-tls/', `${dir}/`);
  const confPath = path.join(dir, 'nginx.conf');
  fs.writeFileSync(confPath, conf);
  await sh(NGINX, ['-t', '-e', 'stderr', '-p', dir, '-c', confPath], dir);
  nginx = await spawnProcess(NGINX, ['-e', 'stderr', '-p', dir, '-c', confPath, '-g', 'daemon off;'],
    { name: 'nginx', cwd: dir });
  await waitUntil(() => canConnect(tlsPort), 10000, { what: 'nginx TLS port' });
  const health = await fetch(`http://127.0.0.1:${healthPort}/healthz`);
  assert.equal(health.status, 200, 'the proxy\'s health endpoint (its probes) answers');

  client = tlsClient(true);
});

after(async () => {
  client?.scaler.close();
  await nginx?.stop('SIGTERM', 5000);
});

// A client configured like KEDA for qwen-7b: TLS with the CA and the client
// certificate, verifying the name in scalerAddress.
function tlsClient(withCert) {
  const { grpc, ExternalScaler, Health } = loadGrpc();
  const read = (f) => fs.readFileSync(path.join(dir, f));
  const creds = withCert
    ? grpc.credentials.createSsl(read('ca.crt'), read('client.key'), read('client.crt'))
    : grpc.credentials.createSsl(read('ca.crt'));
  const opts = { 'grpc.ssl_target_name_override': SERVER_NAME, 'grpc.default_authority': SERVER_NAME };
  const scaler = new ExternalScaler(`127.0.0.1:${tlsPort}`, creds, opts);
  const health = new Health(`127.0.0.1:${tlsPort}`, creds, { ...opts, channelOverride: scaler.getChannel() });
  const unary = (c, m, req) => new Promise((resolve, reject) => {
    c[m](req, new grpc.Metadata(), { deadline: Date.now() + 5000 }, (err, res) => (err ? reject(err) : resolve(res)));
  });
  return {
    scaler,
    getMetricSpec: (ref) => unary(scaler, 'GetMetricSpec', ref),
    check: () => unary(health, 'Check', { service: '' }),
  };
}

const qwenRef = () => {
  const so = find('ScaledObject', 'qwen-7b');
  return { name: so.metadata.name, namespace: so.metadata.namespace, scalerMetadata: so.spec.triggers[0].metadata };
};

test('KEDA\'s calls reach thaw-scaler through the TLS proxy', async () => {
  const ref = qwenRef();
  assert.equal(ref.scalerMetadata.enableTLS, 'true');
  const spec = await client.getMetricSpec(ref);
  assert.equal(spec.metricSpecs[0].metricName, 'thaw-qwen-7b');
  assert.equal(spec.metricSpecs[0].targetSizeFloat, 1);
  assert.equal((await client.check()).status, 'SERVING');
});

test('a wake pushed on StreamIsActive crosses the proxy at once', async () => {
  const call = client.scaler.StreamIsActive(qwenRef());
  const messages = [];
  let ended = null;
  call.on('data', (m) => messages.push({ m, t: Date.now() }));
  call.on('error', (e) => { ended = e; });
  try {
    // The scaler knows the stream once it has read the request.
    await waitUntil(async () => {
      const r = await fetch(`http://127.0.0.1:${Number((await scaler.waitForLog(/http_port=(\d+)/))[1])}/metrics`);
      return /thaw_scaler_active_streams 1\b/.test(await r.text());
    }, 5000, { what: 'the stream to open' });
    const before = messages.length;
    const t0 = Date.now();
    await redis.cli('PUBLISH', 'thaw:wake', 'qwen-7b');
    await waitUntil(() => messages.slice(before).some((x) => x.m.result === true), 3000,
      { intervalMs: 5, what: 'a pushed true' });
    const pushed = messages.slice(before).find((x) => x.m.result === true);
    assert.ok(pushed.t - t0 < 1000, `push took ${pushed.t - t0} ms through the proxy`);
    assert.equal(ended, null);
  } finally {
    call.cancel();
  }
});

test('a client without a certificate is refused', async () => {
  const anon = tlsClient(false);
  try {
    await assert.rejects(anon.getMetricSpec(qwenRef()), (e) => e.code !== 0);
  } finally {
    anon.scaler.close();
  }
});
