// A minimal Redis client on node:net speaking RESP2, for the benchmarks: one
// persistent connection, commands pipelined, replies matched in order. No npm
// redis package, so what is measured is a PUBLISH leaving this process, not a
// client library's queueing.
//
//   const r = await connectRedis(port);
//   await r.command('PUBLISH', 'thaw:wake', 'm1');   // resolves to 1 (an integer)
//   r.send('PUBLISH', 'thaw:wake', 'm1');            // same, returns the promise
//                                                   // after the bytes are written
//   await r.pipeline([['RPUSH', 'k', 'a'], ...]);    // array of replies
//   r.close();
//
// connectRedis(port, host, {onPush}) for a subscriber: after SUBSCRIBE has
// been answered, every reply nobody asked for (a pub/sub message, an array
// ['message', channel, payload]) goes to onPush(value, performance.now()).
//
// Replies: simple strings and bulk strings as JS strings, integers as numbers,
// nil as null, arrays as arrays; an error reply rejects that command's promise
// with an Error whose message is the server's.

import net from 'node:net';
import { performance } from 'node:perf_hooks';

/** RESP encoding of one command (an array of bulk strings). */
export function encodeCommand(args) {
  const parts = [`*${args.length}\r\n`];
  for (const a of args) {
    const s = Buffer.from(String(a));
    parts.push(`$${s.length}\r\n`, s, '\r\n');
  }
  return Buffer.concat(parts.map((p) => (Buffer.isBuffer(p) ? p : Buffer.from(p))));
}

export const INCOMPLETE = Symbol('incomplete');

// Parses one reply at buf[pos]: {value, end} or INCOMPLETE. Error replies come
// back as {value: Error}. A command is an array of bulk strings, so a fake
// server parses what its clients send with it too.
export function parseReply(buf, pos) {
  if (pos >= buf.length) return INCOMPLETE;
  const eol = buf.indexOf('\r\n', pos);
  if (eol < 0) return INCOMPLETE;
  const type = String.fromCharCode(buf[pos]);
  const line = buf.toString('utf8', pos + 1, eol);
  const next = eol + 2;
  switch (type) {
    case '+': return { value: line, end: next };
    case '-': return { value: new Error(line), end: next };
    case ':': return { value: Number(line), end: next };
    case '$': {
      const len = Number(line);
      if (len < 0) return { value: null, end: next };
      if (buf.length < next + len + 2) return INCOMPLETE;
      return { value: buf.toString('utf8', next, next + len), end: next + len + 2 };
    }
    case '*': {
      const n = Number(line);
      if (n < 0) return { value: null, end: next };
      const out = [];
      let p = next;
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, p);
        if (r === INCOMPLETE) return INCOMPLETE;
        out.push(r.value);
        p = r.end;
      }
      return { value: out, end: p };
    }
    default:
      throw new Error(`RESP: unexpected reply type byte 0x${buf[pos].toString(16)}`);
  }
}

/** Connects to 127.0.0.1:port (or host); resolves once the socket is open. */
export function connectRedis(port, host = '127.0.0.1', { onPush = null } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ port, host });
    sock.setNoDelay(true);
    const pending = [];   // {resolve, reject} in send order
    let buf = Buffer.alloc(0);
    let failed = null;

    const failAll = (err) => {
      failed = err;
      while (pending.length) pending.shift().reject(err);
    };
    sock.on('data', (d) => {
      const t = performance.now();
      buf = buf.length ? Buffer.concat([buf, d]) : d;
      let pos = 0;
      for (;;) {
        let r;
        try {
          r = parseReply(buf, pos);
        } catch (e) {
          failAll(e);
          sock.destroy();
          return;
        }
        if (r === INCOMPLETE) break;
        pos = r.end;
        const w = pending.shift();
        if (!w) {   // a reply nobody asked for: a push, or ignored
          if (onPush) onPush(r.value, t);
          continue;
        }
        if (r.value instanceof Error) w.reject(r.value);
        else w.resolve(r.value);
      }
      buf = pos >= buf.length ? Buffer.alloc(0) : buf.subarray(pos);
    });
    sock.on('error', (e) => {
      failAll(e);
      reject(e);
    });
    sock.on('close', () => failAll(failed ?? new Error('redis connection closed')));
    sock.on('connect', () => {
      const client = {
        send(...args) {
          if (failed) return Promise.reject(failed);
          const p = new Promise((res, rej) => pending.push({ resolve: res, reject: rej }));
          sock.write(encodeCommand(args));
          return p;
        },
        command(...args) { return client.send(...args); },
        pipeline(cmds) {
          if (failed) return Promise.reject(failed);
          const ps = cmds.map(() => new Promise((res, rej) => pending.push({ resolve: res, reject: rej })));
          sock.write(Buffer.concat(cmds.map(encodeCommand)));
          return Promise.all(ps);
        },
        close() { sock.end(); sock.destroy(); },
      };
      resolve(client);
    });
  });
}
