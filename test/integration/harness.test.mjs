// Tests of the integration-test harness itself, against the real servers it
// drives (redis-server, prometheus) and an in-process grpc-js server.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import os from 'node:os';
import { after, test } from 'node:test';
import { pathToFileURL } from 'node:url';

import {
  binPath, buildDir, canConnect, freePort, grpcClient, liveProcessCount, loadGrpc,
  repoRoot, spawnProcess, startPrometheus, startRedis, tmpDir, waitUntil,
} from './lib/harness.mjs';

const harnessUrl = pathToFileURL(path.join(repoRoot, 'test', 'integration', 'lib', 'harness.mjs')).href;

function runNode(args, timeoutMs = 60000) {
  // Without this variable the child acts as a top-level runner, not as one of
  // our own test-file children.
  const env = { ...process.env };
  delete env.NODE_TEST_CONTEXT;
  return new Promise((resolve) => {
    execFile(process.execPath, args, { timeout: timeoutMs, cwd: repoRoot, env },
      (err, stdout, stderr) => resolve({ code: err ? err.code : 0, stdout, stderr }));
  });
}

test('paths: repoRoot, buildDir and binPath', () => {
  assert.ok(fs.existsSync(path.join(repoRoot, 'proto', 'externalscaler.proto')));
  assert.ok(path.isAbsolute(buildDir));
  if (process.env.THAW_BUILD_DIR) assert.equal(buildDir, path.resolve(process.env.THAW_BUILD_DIR));
  assert.equal(binPath('thaw-scaler'), path.join(buildDir, 'scaler', 'thaw-scaler'));
  assert.equal(binPath('activator'), path.join(buildDir, 'activator', 'thaw-activator'));
  assert.equal(binPath('thaw-fake-vllm'), path.join(buildDir, 'test', 'fakevllm', 'thaw-fake-vllm'));
  assert.throws(() => binPath('nope'), /unknown binary/);
});

test('freePort gives a bindable loopback port; tmpDir makes a directory', async () => {
  const port = await freePort();
  assert.ok(Number.isInteger(port) && port > 0 && port < 65536);
  const srv = net.createServer();
  await new Promise((resolve, reject) => {
    srv.on('error', reject);
    srv.listen(port, '127.0.0.1', resolve);
  });
  assert.equal(await canConnect(port), true);
  await new Promise((resolve) => srv.close(resolve));
  assert.equal(await canConnect(port), false);

  // Reserved: below the ephemeral range, locked for this process, never
  // handed out twice.
  const lo = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').split(/\s+/)[0]);
  assert.ok(port < lo, `port ${port} is below the ephemeral range (${lo})`);
  const lock = path.join(os.tmpdir(), 'thaw-test-ports', String(port));
  assert.equal(fs.readFileSync(lock, 'utf8'), String(process.pid));
  const many = new Set();
  for (let i = 0; i < 50; i++) many.add(await freePort());
  assert.equal(many.size, 50);
  assert.ok(!many.has(port));

  const d = tmpDir();
  assert.ok(fs.statSync(d).isDirectory());
  assert.notEqual(tmpDir(), d);
});

test('spawnProcess: ready regex, log capture, stop exit code', async () => {
  const script = `
    process.stdout.write('starting\\n');
    setTimeout(() => process.stderr.write('ready port=1234\\n'), 50);
    setTimeout(() => process.stdout.write('later line\\n'), 300);
    process.on('SIGTERM', () => { process.stdout.write('got term\\n'); process.exit(7); });
    setInterval(() => {}, 1000);`;
  const p = await spawnProcess(process.execPath, ['-e', script], { readyLogRegex: /ready port=(\d+)/ });
  assert.equal(p.exitCode, null);
  const m = await p.waitForLog(/ready port=(\d+)/);
  assert.equal(m[1], '1234');
  assert.deepEqual(p.stderr, ['ready port=1234']);
  const mark = p.mark();
  await p.waitForLog(/later line/, 2000, { since: mark });
  await assert.rejects(p.waitForLog(/starting/, 200, { since: mark }), /did not log/);
  assert.equal(await p.stop(), 7);
  assert.equal(p.stopTimedOut, false);
  assert.ok(p.stdout.includes('got term'));
  assert.equal(await p.stop(), 7, 'stopping again returns the same code');
});

test('spawnProcess: SIGKILL after the stop timeout; early exit rejects', async () => {
  const stubborn = await spawnProcess(process.execPath,
    ['-e', "process.on('SIGTERM', () => {}); console.log('up'); setInterval(() => {}, 1000);"],
    { readyLogRegex: /^up$/ });
  const t0 = Date.now();
  assert.equal(await stubborn.stop('SIGTERM', 300), 137);
  assert.equal(stubborn.stopTimedOut, true);
  assert.ok(Date.now() - t0 < 3000);

  await assert.rejects(
    spawnProcess(process.execPath, ['-e', "console.error('bad config'); process.exit(3)"],
      { readyLogRegex: /never/, timeoutMs: 5000 }),
    (e) => /exited with 3/.test(e.message) && /bad config/.test(e.message));
  await assert.rejects(
    spawnProcess(process.execPath, ['-e', 'setInterval(() => {}, 1000)'],
      { readyLogRegex: /never/, timeoutMs: 300 }),
    /did not log/);
  await assert.rejects(spawnProcess('/nonexistent/thaw-binary', []), /cannot start/);
  await waitUntil(() => liveProcessCount() === 0, 2000, { what: 'no live processes' });
});

test('redis: start, cli, stop, restart, kill', async () => {
  const r = await startRedis();
  assert.match(r.url, /^redis:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(await r.cli('PING'), 'PONG');
  assert.equal(await r.cli('SET', 'thaw:k', 'v1'), 'OK');
  assert.equal(await r.cli('GET', 'thaw:k'), 'v1');
  assert.equal(await r.cli('CONFIG', 'GET', 'save'), 'save\n');
  assert.equal(await r.cli('CONFIG', 'GET', 'bind'), 'bind\n127.0.0.1');

  assert.equal(await r.stop(), 0);
  assert.equal(await canConnect(r.port), false);
  await assert.rejects(r.cli('PING'));

  const port = r.port;
  await r.restart();
  assert.equal(r.port, port);
  assert.equal(await r.cli('PING'), 'PONG');
  assert.equal(await r.cli('GET', 'thaw:k'), '', 'no persistence: data is gone after restart');

  assert.equal(await r.kill(), 137);
  assert.equal(await canConnect(port), false);
  await r.restart();
  assert.equal(await r.cli('DBSIZE'), '0');
  await r.restart();   // restart of a running server stops it first
  assert.equal(await r.cli('PING'), 'PONG');
  assert.equal(await r.stop(), 0);
});

test('redis: a fixed port is honoured', async () => {
  const port = await freePort();
  const r = await startRedis({ port });
  assert.equal(r.port, port);
  assert.equal(await r.cli('PING'), 'PONG');
  await r.stop();
});

test('prometheus: vector(1), scraping a target, restart', async () => {
  // A scrape target whose value we choose, to prove scraping really happens.
  let value = 42;
  const target = http.createServer((req, res) => {
    if (req.url !== '/metrics') { res.writeHead(404).end(); return; }
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
    res.end(`# TYPE thaw_harness_gauge gauge\nthaw_harness_gauge{model="m1"} ${value}\n`);
  });
  await new Promise((resolve) => target.listen(0, '127.0.0.1', resolve));
  after(() => target.close());
  const targetAddr = `127.0.0.1:${target.address().port}`;

  const prom = await startPrometheus({ scrapeTargets: [targetAddr], scrapeInterval: '1s' });
  assert.match(prom.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  const body = await prom.query('vector(1)');
  assert.equal(body.status, 'success');
  assert.equal(body.data.resultType, 'vector');
  assert.equal(body.data.result.length, 1);
  assert.equal(body.data.result[0].value[1], '1');
  await assert.rejects(prom.query('sum(('), /bad_data/);

  const up = await prom.waitForSeries(`up{instance="${targetAddr}"}`, (r) => r.length === 1 && r[0].value[1] === '1', 15000);
  assert.equal(up[0].metric.job, 'thaw');
  await prom.waitForSeries('thaw_harness_gauge{model="m1"}', (r) => r.length === 1 && r[0].value[1] === '42', 15000);
  value = 7;
  await prom.waitForSeries('thaw_harness_gauge{model="m1"}', (r) => r.length === 1 && r[0].value[1] === '7', 15000);
  await assert.rejects(prom.waitForSeries('thaw_no_such_metric', undefined, 600), /did not satisfy/);

  const port = prom.port;
  await prom.restart();
  assert.equal(prom.port, port);
  assert.equal((await prom.query('vector(1)')).data.result[0].value[1], '1');

  await prom.setScrapeTargets([]);
  assert.equal(await prom.stop(), 0);
  assert.equal(await canConnect(port), false);
});

test('grpcClient against an in-process grpc-js server', async () => {
  const { grpc, ExternalScaler, Health } = loadGrpc();
  const server = new grpc.Server();
  const seen = [];
  server.addService(Health.service, {
    Check(call, cb) {
      if (call.request.service === '' || call.request.service === 'externalscaler.ExternalScaler') {
        cb(null, { status: 'SERVING' });
      } else {
        cb({ code: grpc.status.NOT_FOUND, details: `unknown service ${call.request.service}` });
      }
    },
    Watch(call) { call.end(); },
  });
  server.addService(ExternalScaler.service, {
    IsActive(call, cb) {
      seen.push(call.request);
      const model = call.request.scalerMetadata.model;
      if (!model) { cb({ code: grpc.status.INVALID_ARGUMENT, details: 'scalerMetadata.model is required' }); return; }
      cb(null, { result: model === 'hot' });
    },
    GetMetricSpec(call, cb) {
      cb(null, { metricSpecs: [{ metricName: call.request.scalerMetadata.model, targetSizeFloat: 2.5 }] });
    },
    GetMetrics(call, cb) {
      seen.push(call.request);
      cb(null, { metricValues: [{ metricName: call.request.metricName, metricValue: 3, metricValueFloat: 3.25 }] });
    },
    StreamIsActive(call) {
      call.write({ result: false });
      const timer = setTimeout(() => call.write({ result: true }), 200);
      call.on('cancelled', () => clearTimeout(timer));
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(),
      (err, p) => (err ? reject(err) : resolve(p)));
  });
  after(() => server.forceShutdown());

  const c = grpcClient(`127.0.0.1:${port}`);
  after(() => c.close());
  await c.waitForReady(5000);
  assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
  assert.deepEqual(await c.healthCheck('externalscaler.ExternalScaler'), { status: 'SERVING' });
  await assert.rejects(c.healthCheck('nope'),
    (e) => e.code === grpc.status.NOT_FOUND && e.details === 'unknown service nope');

  const ref = { name: 'so1', namespace: 'default', scalerMetadata: { model: 'hot' } };
  assert.deepEqual(await c.isActive(ref), { result: true });
  assert.deepEqual(await c.isActive({ ...ref, scalerMetadata: { model: 'cold' } }), { result: false },
    'false is reported as a default, not left undefined');
  await assert.rejects(c.isActive({ name: 'x', namespace: 'y' }),
    (e) => e.code === grpc.status.INVALID_ARGUMENT && /model is required/.test(e.details));
  assert.deepEqual(seen[0], ref, 'the server sees camelCase fields and the metadata map');

  const spec = await c.getMetricSpec(ref);
  assert.equal(spec.metricSpecs.length, 1);
  assert.equal(spec.metricSpecs[0].metricName, 'hot');
  assert.equal(spec.metricSpecs[0].targetSizeFloat, 2.5);
  assert.equal(spec.metricSpecs[0].targetSize, 0);

  const metrics = await c.getMetrics({ scaledObjectRef: ref, metricName: 'hot' });
  assert.deepEqual(metrics.metricValues, [{ metricName: 'hot', metricValue: 3, metricValueFloat: 3.25 }]);

  // Raw bytes: an empty ScaledObjectRef is valid protobuf (all defaults).
  const raw = await c.unaryRaw('/externalscaler.ExternalScaler/GetMetricSpec', Buffer.alloc(0));
  assert.ok(Buffer.isBuffer(raw));

  const s = c.streamIsActive(ref);
  const first = await s.waitFor(() => true, 5000);
  assert.equal(first.msg.result, false);
  const hot = await s.waitFor((m) => m.result === true, 5000);
  assert.equal(hot.index, 1);
  assert.ok(hot.t - first.t >= 150, `second message ${hot.t - first.t} ms after the first`);
  await assert.rejects(s.waitFor((m, all) => all.length > 2, 300), /no matching/);
  s.cancel();
  await waitUntil(() => s.ended, 2000, { what: 'stream end after cancel' });
  assert.equal(s.error, null);

  await assert.rejects(grpcClient(`127.0.0.1:${await freePort()}`).isActive(ref, { deadlineMs: 2000 }),
    (e) => e.code === grpc.status.UNAVAILABLE);
});

test('processes are killed when a test file fails or a script exits', async () => {
  const dir = tmpDir();
  // A test file that starts redis and then fails: the harness after() hook
  // must stop it.
  const failing = path.join(dir, 'failing.test.mjs');
  fs.writeFileSync(failing, `
    import { test } from 'node:test';
    import assert from 'node:assert/strict';
    import { startRedis } from ${JSON.stringify(harnessUrl)};
    test('fails with redis running', async () => {
      const r = await startRedis();
      console.log('REDIS_PORT=' + r.port);
      assert.equal(1, 2);
    });
  `);
  const res1 = await runNode(['--test', '--test-reporter=tap', failing]);
  assert.notEqual(res1.code, 0, 'the fixture test fails');
  const port1 = Number(/REDIS_PORT=(\d+)/.exec(res1.stdout + res1.stderr)?.[1]);
  assert.ok(port1 > 0, `fixture printed its port:\n${res1.stdout}`);
  assert.equal(await canConnect(port1), false, 'redis from the failed test is gone');

  // A plain script that exits abruptly: the 'exit' hook must SIGKILL.
  const script = path.join(dir, 'abrupt.mjs');
  fs.writeFileSync(script, `
    import { startRedis } from ${JSON.stringify(harnessUrl)};
    const r = await startRedis();
    console.log('REDIS_PORT=' + r.port);
    process.exit(9);
  `);
  const res2 = await runNode([script]);
  assert.equal(res2.code, 9);
  assert.doesNotMatch(res2.stdout, /TAP version/, 'no stray TAP report from a plain script');
  const port2 = Number(/REDIS_PORT=(\d+)/.exec(res2.stdout)?.[1]);
  assert.ok(port2 > 0);
  await waitUntil(async () => !(await canConnect(port2)), 3000, { what: `redis on ${port2} to die` });
});

test('bench peers: h2load payload decodes; reference server answers', async () => {
  const { requestBody, loadScalerProto } = await import(pathToFileURL(path.join(repoRoot, 'bench', 'lib', 'grpc_payload.mjs')).href);
  const body = requestBody({ model: 'm1' });
  assert.equal(body[0], 0, 'not compressed');
  assert.equal(body.readUInt32BE(1), body.length - 5);
  const { packageDefinition } = loadScalerProto();
  const decoded = packageDefinition['externalscaler.ExternalScaler'].GetMetrics.requestDeserialize(body.subarray(5));
  assert.deepEqual(decoded, {
    scaledObjectRef: { name: 'bench', namespace: 'default', scalerMetadata: { model: 'm1' } },
    metricName: 'm1',
  });

  const srv = await spawnProcess(process.execPath, [path.join(repoRoot, 'bench', 'ref-grpc-server.mjs'), '--port', '0', '--value', '3'],
    { readyLogRegex: /^listening port=\d+$/ });
  const port = Number((await srv.waitForLog(/^listening port=(\d+)$/))[1]);
  const c = grpcClient(`127.0.0.1:${port}`);
  const ref = { name: 'so', namespace: 'ns', scalerMetadata: { model: 'm1' } };
  assert.deepEqual((await c.getMetrics({ scaledObjectRef: ref, metricName: 'm1' })).metricValues,
    [{ metricName: 'm1', metricValue: 3, metricValueFloat: 3 }]);
  assert.equal((await c.getMetricSpec(ref)).metricSpecs[0].metricName, 'm1');
  assert.deepEqual(await c.isActive(ref), { result: true });
  assert.deepEqual(await c.healthCheck(''), { status: 'SERVING' });
  // The exact bytes h2load sends, through the same HTTP/2 path.
  const raw = await c.unaryRaw('/externalscaler.ExternalScaler/GetMetrics', body.subarray(5));
  assert.equal(packageDefinition['externalscaler.ExternalScaler'].GetMetrics.responseDeserialize(raw).metricValues[0].metricValueFloat, 3);
  c.close();
  assert.equal(await srv.stop(), 0);
  assert.ok(srv.stdout.includes('served requests=5'), srv.output());
});
