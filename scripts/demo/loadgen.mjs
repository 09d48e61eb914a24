// The demo's load generator: replays a schedule (trace.mjs) as
// OpenAI-compatible requests, /v1/completions and /v1/chat/completions,
// streaming and not, and records per request what a client sees.
//
// Requests go to one HTTP endpoint (the activator), or, in the no-activator
// mode used before the activator existed, to a ready replica chosen by a
// DirectRouter (least outstanding), which also holds requests for a model
// with no ready replica and sends the activator's Redis signals itself.

import http from 'node:http';

// ~4 characters a token, as the fake server (and English text) counts.
const WORDS = 'the quick brown fox jumps over a lazy dog while seven tired cats watch ';
let promptCache = WORDS;
function promptText(tokens) {
  const chars = Math.max(1, tokens) * 4;
  while (promptCache.length < chars) promptCache += promptCache;
  return promptCache.slice(0, chars);
}

/** Request shapes, cycled by sequence number: both APIs, streaming and not. */
export const KINDS = [
  { api: 'completions', stream: false },
  { api: 'chat', stream: true },
  { api: 'completions', stream: true },
  { api: 'chat', stream: false },
];

function requestBody(e, kind) {
  const body = { model: e.model, max_tokens: e.maxTokens, temperature: 0 };
  if (kind.api === 'chat') body.messages = [{ role: 'user', content: promptText(e.promptTokens) }];
  else body.prompt = promptText(e.promptTokens);
  if (kind.stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return JSON.stringify(body);
}

/** Per-model counters, cumulative; the orchestrator differences them per second. */
function newCounters() {
  return {
    sent: 0, answered: 0, ok: 0, failed: 0, lost: 0, inflight: 0,
    held: 0, requestedTokens: 0, tokens: 0, promptTokens: 0,
  };
}

export class LoadGen {
  /**
   * opts: schedule, models, target ({host, port}) or router (DirectRouter),
   * requestTimeoutMs, now() (ms clock).
   */
  constructor(opts) {
    this.opts = { requestTimeoutMs: 300000, ...opts };
    this.schedule = opts.schedule;
    this.next = 0;
    this.records = [];
    this.inflight = new Set();
    this.counters = Object.fromEntries(opts.models.map((m) => [m, newCounters()]));
    this.agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 256 });
    this.timer = null;
    this.t0 = null;
    this.sendingStopped = false;
  }

  /** Starts the replay; t0 is the wall-clock ms of schedule time 0. */
  start(t0 = Date.now()) {
    this.t0 = t0;
    const tick = () => {
      if (this.sendingStopped) return;
      const elapsed = (Date.now() - this.t0) / 1000;
      while (this.next < this.schedule.length && this.schedule[this.next].at <= elapsed) {
        this.send(this.schedule[this.next++]);
      }
      if (this.next >= this.schedule.length) { this.stopSending(); return; }
      const wait = Math.max(0, (this.schedule[this.next].at - elapsed) * 1000);
      this.timer = setTimeout(tick, Math.min(wait, 50));
    };
    tick();
  }

  stopSending() {
    this.sendingStopped = true;
    clearTimeout(this.timer);
  }

  doneSending() { return this.next >= this.schedule.length || this.sendingStopped; }

  /** Resolves when nothing is in flight (or after timeoutMs; returns false then). */
  async waitIdle(timeoutMs) {
    const end = Date.now() + timeoutMs;
    while (this.inflight.size > 0) {
      if (Date.now() >= end) return false;
      await new Promise((r) => setTimeout(r, 100));
    }
    return true;
  }

  /**
   * Aborts every request still in flight with `reason`: lost when no status
   * line came yet, else answered but truncated (a failure).
   */
  abortAll(reason) {
    for (const rec of [...this.inflight]) rec.abort(reason);
  }

  async send(e) {
    const kind = KINDS[e.seq % KINDS.length];
    const c = this.counters[e.model];
    const rec = {
      seq: e.seq, model: e.model, api: kind.api, stream: kind.stream,
      promptTokens: e.promptTokens, maxTokens: e.maxTokens,
      scheduledAt: e.at, sentMs: Date.now(), headersMs: null, firstTokenMs: null, doneMs: null,
      status: null, outcome: null, error: null, held: false, holdMs: null, tokens: 0,
    };
    this.records.push(rec);
    this.inflight.add(rec);
    c.sent++;
    c.inflight++;
    c.requestedTokens += e.maxTokens;
    c.promptTokens += e.promptTokens;

    let settled = false;
    let timer = null;
    let release = null;
    const finish = (outcome, error = null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      rec.doneMs = Date.now();
      rec.outcome = outcome;
      rec.error = error;
      this.inflight.delete(rec);
      c.inflight--;
      if (rec.status !== null) c.answered++; else c.lost++;
      if (outcome === 'ok') c.ok++; else if (rec.status !== null) c.failed++;
      release?.();
    };
    rec.settled = () => settled;
    // After the status line a cut is a truncated answer, before it a lost request.
    rec.abort = (why) => finish(rec.status === null ? 'lost' : 'truncated', why);

    let target = this.opts.target;
    if (this.opts.router) {
      try {
        const got = await this.opts.router.acquire(e.model, rec);
        target = got.target;
        release = got.release;
      } catch (err) {
        finish('lost', `router: ${err.message}`);
        return;
      }
      if (settled) { release(); return; }
    }

    const body = requestBody(e, kind);
    const req = http.request({
      host: target.host, port: target.port, method: 'POST', agent: this.agent,
      path: kind.api === 'chat' ? '/v1/chat/completions' : '/v1/completions',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), accept: kind.stream ? 'text/event-stream' : 'application/json' },
    });
    timer = setTimeout(() => rec.abort('timeout'), this.opts.requestTimeoutMs);
    rec.abort = (why) => { finish(rec.status === null ? 'lost' : 'truncated', why); req.destroy(new Error(why)); };

    req.on('error', (err) => {
      // After the status line this is a broken response (answered, failed).
      finish(rec.status === null ? 'lost' : 'truncated', err.code ?? err.message);
    });
    req.on('response', (res) => {
      rec.status = res.statusCode;
      rec.headersMs = Date.now();
      const hold = res.headers['x-thaw-cold-start-ms'];
      if (hold !== undefined) {
        rec.held = true;
        rec.holdMs = Number(hold);
        c.held++;
      } else if (rec.routerHoldMs !== undefined) {
        rec.held = true;
        rec.holdMs = rec.routerHoldMs;
        c.held++;
      }
      const isSse = /text\/event-stream/.test(res.headers['content-type'] ?? '');
      let buf = '';
      let done = false;
      let bad = null;
      res.setEncoding('utf8');
      res.on('data', (chunk) => {
        buf += chunk;
        if (!isSse || res.statusCode !== 200) return;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue; // comments (heartbeats) and other fields
            const data = line.slice(5).trim();
            if (data === '[DONE]') { done = true; continue; }
            try {
              const j = JSON.parse(data);
              const ch = j.choices?.[0];
              const piece = ch?.text ?? ch?.delta?.content;
              if (piece) {
                rec.tokens++;
                c.tokens++;
                if (rec.firstTokenMs === null) rec.firstTokenMs = Date.now();
              }
              if (j.usage?.completion_tokens !== undefined) rec.usageTokens = j.usage.completion_tokens;
            } catch {
              bad = 'bad_sse_json';
            }
          }
        }
      });
      res.on('error', (err) => finish('truncated', err.code ?? err.message));
      res.on('aborted', () => finish('truncated', 'aborted'));
      res.on('end', () => {
        if (res.statusCode !== 200) {
          finish(`http_${res.statusCode}`, buf.slice(0, 300));
          return;
        }
        if (isSse) {
          if (bad) finish(bad);
          else if (!done) finish('stream_incomplete');
          else finish('ok');
          return;
        }
        try {
          const j = JSON.parse(buf);
          const n = j.usage?.completion_tokens ?? 0;
          rec.tokens = n;
          c.tokens += n;
          rec.firstTokenMs = null; // not observable without streaming
          finish(j.choices?.length ? 'ok' : 'bad_json');
        } catch {
          finish('bad_json', buf.slice(0, 300));
        }
      });
    });
    req.end(body);
  }

  close() { this.agent.destroy(); }
}

/**
 * The no-activator stand-in: routes each request to the model's ready
 * replica with the fewest outstanding requests; with none ready it holds the
 * request, publishes the wake signal and keeps the held count fresh in Redis
 * (the contract of the scaler issue), and releases held requests in arrival
 * order once a replica is ready. Not Thaw's activator: no probing of its own,
 * no retry when a replica goes away.
 */
export class DirectRouter {
  constructor({ cluster, redisCli, instanceId = 'demo-direct' }) {
    this.cluster = cluster;
    this.redisCli = redisCli;
    this.instanceId = instanceId;
    this.outstanding = new Map(); // port -> count
    this.held = new Map();        // model -> [{resolve, rec, t}]
    this.timer = setInterval(() => this.pump(), 20);
    this.heldTimer = setInterval(() => this.refreshHeld(), 1000);
  }

  heldCount(model) { return this.held.get(model)?.length ?? 0; }

  acquire(model, rec) {
    return new Promise((resolve) => {
      const q = this.held.get(model) ?? [];
      this.held.set(model, q);
      q.push({ resolve, rec, t: Date.now() });
      if (q.length === 1 && this.cluster.readyEndpoints(model).length === 0) {
        this.redisCli('HSET', `thaw:held:${model}`, this.instanceId, `${q.length}:${Date.now()}`)
          .then(() => this.redisCli('PUBLISH', 'thaw:wake', model)).catch(() => {});
      }
      this.pump();
    });
  }

  pump() {
    for (const [model, q] of this.held) {
      if (!q.length) continue;
      const eps = this.cluster.readyEndpoints(model);
      if (!eps.length) continue;
      while (q.length) {
        const h = q.shift();
        if (h.rec.settled()) continue; // aborted while held
        eps.sort((a, b) => (this.outstanding.get(a.port) ?? 0) - (this.outstanding.get(b.port) ?? 0));
        const ep = eps[0];
        this.outstanding.set(ep.port, (this.outstanding.get(ep.port) ?? 0) + 1);
        const waited = Date.now() - h.t;
        if (waited > 20) h.rec.routerHoldMs = waited;
        h.resolve({
          target: { host: '127.0.0.1', port: ep.port },
          release: () => this.outstanding.set(ep.port, (this.outstanding.get(ep.port) ?? 1) - 1),
        });
      }
    }
  }

  refreshHeld() {
    for (const [model, q] of this.held) {
      if (q.length) this.redisCli('HSET', `thaw:held:${model}`, this.instanceId, `${q.length}:${Date.now()}`).catch(() => {});
    }
  }

  close() {
    clearInterval(this.timer);
    clearInterval(this.heldTimer);
  }
}
