// Out-of-protocol Redis replies: thaw-scaler and thaw-activator against a
// fake Redis on loopback that answers like Redis but adds what no Redis sends
// and hiredis 0.14 aborts the process on (a reply no command asked for; a
// pub/sub message that is not an array of >= 2 strings). Expected: each
// binary refuses the reply (event=redis_reply_refused with the reason), drops
// the connection and reconnects with backoff, stays up and serving, and is
// connected again within seconds of the fake turning well-behaved.
// Without the guard (common/redis_guard.c) both processes abort on the first
// such reply.
import net from 'node:net';
import { after, test } from 'node:test';

import { INCOMPLETE, parseReply } from '../../bench/lib/resp.mjs';
import { metricSum, request, startActivator } from './activator_lib.mjs';
import { assert, sleep } from './faults_lib.mjs';
import { freePort, startPrometheus, waitUntil } from './lib/harness.mjs';
import { sampleValue, startScaler } from './lib/scaler_env.mjs';

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

/**
 * A fake Redis. hostile: after the second SCRIPT LOAD answer it adds ":1"
 * (no command asked for it), after a SUBSCRIBE confirmation a one-element
 * message, and greet sends a reply at once on every new connection.
 */
async function startFakeRedis({ greet = '' } = {}) {
  const port = await freePort();
  const fake = { port, url: `redis://127.0.0.1:${port}`, hostile: true, accepts: 0, sockets: new Set() };
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
        if (name === 'SCRIPT' && args[1].toUpperCase() === 'LOAD') {
          out = bulk((loads++ === 0 ? 'a' : 'b').repeat(40));
          if (fake.hostile && loads === 2) out += ':1\r\n';
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
