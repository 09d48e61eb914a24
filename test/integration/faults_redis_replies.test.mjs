// Out-of-protocol Redis replies: thaw-scaler and thaw-activator against a
// fake Redis on loopback that answers like Redis but adds what no Redis sends
// and hiredis 0.14 aborts the process on (a reply no command asked for; a
// pub/sub message that is not an array of >= 2 strings). Expected: each
// binary refuses the reply (event=redis_reply_refused with the reason), drops
// the connection and reconnects with backoff, stays up and serving, and is
// connected again within seconds of the fake turning well-behaved.
// Without the guard (common/redis_guard.c) both processes abort on the first
// such reply.
import fs from 'node:fs';
import net from 'node:net';
import { after, test } from 'node:test';

import { INCOMPLETE, parseReply } from '../../bench/lib/resp.mjs';
import { metricSum, request, startActivator } from './activator_lib.mjs';
import { assert, sleep, underSanitizer, underValgrind } from './faults_lib.mjs';
import { freePort, startPrometheus, waitUntil } from './lib/harness.mjs';
import { sampleValue, scaledObjectRef, startScaler } from './lib/scaler_env.mjs';

const started = [];
after(async () => {
  for (const stop of started.reverse()) await stop();
});

/** Splits complete RESP commands (arrays of bulk strings, as hiredis writes
 * them) off buf; returns [commands, rest]. */
function parseCommands(buf) {
  const cmds = [];
  let pos = 0;
  for (;;) {
    const r = parseReply(buf, pos);
    if (r === INCOMPLETE) return [cmds, buf.subarray(pos)];
    cmds.push(r.value);
    pos = r.end;
  }
}

const bulk = (s) => `$${Buffer.byteLength(s)}\r\n${s}\r\n`;

/** Writes a bulk string declared as 1 GB on sock, 1 MiB at a time while
 * the peer reads, until it closes: a reply hiredis builds only when whole. */
function endlessBulk(sock, fake) {
  sock.write('$1000000000\r\n');
  const chunk = Buffer.alloc(1 << 20, 'x');
  const pump = () => {
    while (!sock.destroyed && sock.write(chunk)) fake.bulkBytes += chunk.length;
  };
  sock.on('drain', pump);
  pump();
}

/**
 * A fake Redis. hostile: after the second SCRIPT LOAD answer it adds ":1"
 * (no command asked for it), after a SUBSCRIBE confirmation a one-element
 * message, and greet sends a reply at once on every new connection.
 * bigBulk (with hostile): a SUBSCRIBE confirmation is followed by a message
 * whose payload is an endless bulk string, and so is the reply to every
 * EVALSHA, EVAL, HSET and PUBLISH.
 */
async function startFakeRedis({ greet = '', bigBulk = false } = {}) {
  const port = await freePort();
  const fake = { port, url: `redis://127.0.0.1:${port}`, hostile: true, accepts: 0, sockets: new Set(), bulkBytes: 0 };
  const server = net.createServer((sock) => {
    fake.accepts++;
    fake.sockets.add(sock);
    sock.on('close', () => fake.sockets.delete(sock));
    sock.on('error', () => {});
    let buf = Buffer.alloc(0);
    let loads = 0;
    if (fake.hostile && greet) sock.write(greet);
    sock.on('data', (d) => {
      let cmds;
      [cmds, buf] = parseCommands(Buffer.concat([buf, d]));
      for (const args of cmds) {
        const name = args[0].toUpperCase();
        let out;
        if (bigBulk && fake.hostile && ['SUBSCRIBE', 'EVALSHA', 'EVAL', 'HSET', 'PUBLISH'].includes(name)) {
          if (name === 'SUBSCRIBE') sock.write(`*3\r\n${bulk('subscribe')}${bulk(args[1])}:1\r\n*3\r\n${bulk('message')}${bulk(args[1])}`);
          endlessBulk(sock, fake);
          return; // nothing else is answered on this connection
        }
        if (name === 'SCRIPT' && args[1].toUpperCase() === 'LOAD') {
          out = bulk((loads++ === 0 ? 'a' : 'b').repeat(40));
          if (fake.hostile && !bigBulk && loads === 2) out += ':1\r\n';
        } else if (name === 'SUBSCRIBE') {
          out = `*3\r\n${bulk('subscribe')}${bulk(args[1])}:1\r\n`;
          if (fake.hostile) out += `*1\r\n${bulk('message')}`;
        } else if (name === 'EVALSHA') {
          const n = Number(args[2]);
          const vals = args[1][0] === 'a' ? Array(n).fill(':0\r\n') : Array(n).fill(':0\r\n:0\r\n:-1\r\n');
          out = `*${vals.length}\r\n${vals.join('')}`;
        } else if (['HSET', 'HDEL', 'PUBLISH', 'EVAL', 'ZREM'].includes(name)) {
          out = ':1\r\n';
        } else {
          out = '+OK\r\n';
        }
        sock.write(out);
      }
    });
  });
  await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
  fake.stop = () => new Promise((resolve) => {
    for (const s of fake.sockets) s.destroy();
    server.close(() => resolve());
  });
  started.push(fake.stop);
  return fake;
}

test('thaw-activator: a reply no command asked for is refused, not an abort; it reconnects', async () => {
  const fake = await startFakeRedis({ greet: '+OK\r\n' });
  const backendPort = await freePort(); // nothing listens: the model stays cold
  const act = await startActivator(
    { models: [{ name: 'rr-a', backend: `http://127.0.0.1:${backendPort}` }] },
    { redisUrl: fake.url, instanceId: 'act-rr' });
  started.push(() => act.stop());
  await act.proc.waitForLog(/event=redis_reply_refused reason=unsolicited_reply/, 5000);
  await waitUntil(() => fake.accepts >= 3, 10000, { what: 'reconnections after refusals' });
  assert.equal(act.proc.exitCode, null, `activator exited; output:\n${act.proc.output().slice(-2000)}`);
  const health = await request(act.adminPort, { path: '/healthz' });
  assert.equal(health.status, 200, 'the activator keeps serving while Redis misbehaves');
  assert.ok(metricSum(await act.metrics(), 'thaw_activator_redis_replies_refused_total') >= 2,
    'refusals counted');

  fake.hostile = false;
  for (const s of fake.sockets) s.destroy(); // the next connection is a well-behaved one
  await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 1, 10000,
    { what: 'activator connected again' });
});

test('thaw-scaler: an unasked reply and a malformed pub/sub message are refused; it reconnects', async () => {
  const fake = await startFakeRedis();
  const prom = await startPrometheus({ scrapeTargets: [] });
  started.push(() => prom.stop());
  const scaler = await startScaler({ prometheusUrl: prom.url, redisUrl: fake.url, name: 'thaw-scaler-rr' });
  started.push(async () => {
    const code = await scaler.stop();
    assert.equal(code, 0, `thaw-scaler exit code; output:\n${scaler.proc.output().slice(-3000)}`);
  });
  await scaler.proc.waitForLog(/event=redis_reply_refused reason=unsolicited_reply/, 5000);
  await scaler.proc.waitForLog(/event=redis_reply_refused reason=pubsub_message_short/, 5000);
  await sleep(1500); // a few more rounds of refusal and reconnection
  assert.equal(scaler.proc.exitCode, null, `scaler exited; output:\n${scaler.proc.output().slice(-2000)}`);
  assert.ok(fake.accepts >= 4, `both connections reopened after refusals (${fake.accepts} accepts)`);
  const health = await scaler.get('/healthz');
  assert.equal(health.status, 200, 'the scaler keeps serving while Redis misbehaves');
  assert.ok(sampleValue(await scaler.metrics(), 'thaw_scaler_redis_replies_refused_total') >= 2,
    'refusals counted');

  const mark = scaler.proc.mark();
  fake.hostile = false;
  await scaler.proc.waitForLog(/event=redis_connected conn=cmd/, 10000, { since: mark });
  await scaler.proc.waitForLog(/event=redis_connected conn=sub/, 10000, { since: mark });
  const refusedAfter = scaler.proc.output().split('\n').slice(mark)
    .filter((l) => /redis_reply_refused/.test(l)).length;
  await sleep(1500);
  const refusedLater = scaler.proc.output().split('\n').slice(mark)
    .filter((l) => /redis_reply_refused/.test(l)).length;
  assert.equal(refusedLater, refusedAfter, 'a well-behaved Redis is not refused');
});

test('an endless bulk string is refused at 16 MiB, not buffered without bound; both reconnect', async (t) => {
  const fake = await startFakeRedis({ bigBulk: true });
  const prom = await startPrometheus({ scrapeTargets: [] });
  started.push(() => prom.stop());
  const scaler = await startScaler({ prometheusUrl: prom.url, redisUrl: fake.url, name: 'thaw-scaler-bulk' });
  started.push(async () => {
    const code = await scaler.stop();
    assert.equal(code, 0, `thaw-scaler exit code; output:\n${scaler.proc.output().slice(-3000)}`);
  });
  const backendPort = await freePort();
  const act = await startActivator(
    { models: [{ name: 'bulk-a', backend: `http://127.0.0.1:${backendPort}` }] },
    { redisUrl: fake.url, instanceId: 'act-bulk' });
  started.push(() => act.stop());
  // A target, so the scaler sends its batches (scripts) on the command connection.
  await scaler.client.getMetricSpec(scaledObjectRef('bulk-so', { model: 'bulk-m' }));
  // The pub/sub connection (a message) and the command connection (a
  // script's reply) of the scaler, and the activator's.
  await scaler.proc.waitForLog(/event=redis_disconnected conn=sub reason="reply over 16777216 bytes refused"/, 10000);
  await scaler.proc.waitForLog(/event=redis_disconnected conn=cmd reason="reply over 16777216 bytes refused"/, 10000);
  await act.proc.waitForLog(/event=redis_reply_refused reason=reply_too_big/, 10000);
  await sleep(2000); // more rounds of it
  const hwm = (pid) => Number(/VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
  const [scalerMB, actMB] = [hwm(scaler.proc.pid) / 1024, hwm(act.proc.pid) / 1024];
  t.diagnostic(`${(fake.bulkBytes / 2 ** 20).toFixed(0)} MiB sent; peak RSS scaler ${scalerMB.toFixed(0)} MB, activator ${actMB.toFixed(0)} MB`);
  assert.ok(fake.bulkBytes > 3 * 16 * 2 ** 20, `the fake sent ${fake.bulkBytes} bytes`);
  // Without the bound the scaler took 2.4 GB in 15 s; sanitizers add their own.
  const limitMB = underSanitizer || underValgrind ? 600 : 120;
  assert.ok(scalerMB < limitMB, `scaler peak RSS ${scalerMB} MB`);
  assert.ok(actMB < limitMB, `activator peak RSS ${actMB} MB`);
  assert.equal((await scaler.get('/healthz')).status, 200);

  fake.hostile = false;
  for (const sock of fake.sockets) sock.destroy();
  const mark = scaler.proc.mark();
  await scaler.proc.waitForLog(/event=redis_connected conn=sub/, 10000, { since: mark });
  await waitUntil(async () => metricSum(await act.metrics(), 'thaw_activator_redis_up') === 1, 10000,
    { what: 'activator connected again' });
});
