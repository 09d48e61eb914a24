// The demo's services: Prometheus with file-based service discovery (the
// local stand-in for Kubernetes pod discovery), thaw-scaler and
// thaw-activator, each on free loopback ports. Processes are started through
// the test harness, whose registry kills whatever is left at exit.

import fs from 'node:fs';
import path from 'node:path';

import { binPath, freePort, spawnProcess, waitUntil, PROMETHEUS } from '../../test/integration/lib/harness.mjs';

const SETSID = '/usr/bin/setsid';

/**
 * spawnProcess in a session of its own: Ctrl-C in a terminal signals the
 * whole foreground process group, and the demo wants to stop its services
 * itself, in order (clients first, then replicas, then the services), so
 * that an interrupted run still ends cleanly and reports what it saw.
 * setsid execs in place (the child is no group leader), so the pid is the
 * service's own and the harness's registry still stops it.
 */
export function spawnService(cmd, args, opts) {
  if (!fs.existsSync(SETSID)) return spawnProcess(cmd, args, opts);
  return spawnProcess(SETSID, [cmd, ...args], { name: path.basename(cmd), ...opts });
}

/** Writes file atomically (readers polling mtime/inode never see half of it). */
export function writeAtomic(file, text) {
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

/**
 * Starts prometheus scraping every target listed through setTargets() every
 * `interval` (file_sd: new replicas are scraped within a second, like pods
 * found by Kubernetes service discovery). Targets: [{address, labels}].
 */
export async function startPrometheus({ dir, interval = '1s' }) {
  fs.mkdirSync(dir, { recursive: true });
  const sdFile = path.join(dir, 'targets.json');
  writeAtomic(sdFile, '[]\n');
  const cfg = path.join(dir, 'prometheus.yml');
  fs.writeFileSync(cfg, [
    'global:',
    `  scrape_interval: ${interval}`,
    `  scrape_timeout: ${interval}`,
    `  evaluation_interval: ${interval}`,
    'scrape_configs:',
    '  - job_name: thaw-demo',
    '    file_sd_configs:',
    `      - files: ['${sdFile}']`,
    `        refresh_interval: ${interval}`,
    '',
  ].join('\n'));
  let port = await freePort();
  let proc = null;
  for (let attempt = 0; ; attempt++) {
    try {
      proc = await spawnService(PROMETHEUS, [
        `--config.file=${cfg}`,
        `--storage.tsdb.path=${path.join(dir, 'data')}`,
        `--web.listen-address=127.0.0.1:${port}`,
        '--log.level=warn',
      ], { name: 'prometheus', cwd: dir, timeoutMs: 30000 });
      await waitUntil(async () => {
        if (proc.exitCode !== null) throw new Error(`prometheus exited: ${proc.output().slice(-2000)}`);
        const res = await fetch(`http://127.0.0.1:${port}/-/ready`);
        await res.arrayBuffer();
        return res.status === 200;
      }, 30000, { intervalMs: 200, what: 'prometheus /-/ready' });
      break;
    } catch (e) {
      if (proc) await proc.kill();
      if (attempt >= 2 || !/address already in use/i.test(`${e.message} ${proc?.output() ?? ''}`)) throw e;
      port = await freePort();
    }
  }
  return {
    proc,
    port,
    url: `http://127.0.0.1:${port}`,
    setTargets(targets) {
      const groups = targets.map((t) => ({ targets: [t.address], labels: t.labels ?? {} }));
      writeAtomic(sdFile, `${JSON.stringify(groups, null, 1)}\n`);
    },
    async query(promql) {
      const res = await fetch(`http://127.0.0.1:${port}/api/v1/query?${new URLSearchParams({ query: promql })}`);
      const body = await res.json();
      if (body.status !== 'success') throw new Error(`prometheus: ${body.error}`);
      return body.data.result;
    },
    stop: () => proc.stop('SIGTERM', 10000),
  };
}

/** Starts thaw-scaler; resolves to {proc, grpcAddress, httpBase, stop()}. */
export async function startScaler({ redisUrl, prometheusUrl, flags = {} }) {
  const args = ['--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--redis-url', redisUrl, '--prometheus-url', prometheusUrl];
  for (const [k, v] of Object.entries(flags)) args.push(`--${k}`, String(v));
  const proc = await spawnService(binPath('thaw-scaler'), args, {
    name: 'thaw-scaler', readyLogRegex: /event=listening grpc_port=\d+ http_port=\d+/, timeoutMs: 15000,
  });
  const m = await proc.waitForLog(/event=listening grpc_port=(\d+) http_port=(\d+)/);
  const httpPort = Number(m[2]);
  return {
    proc,
    grpcAddress: `127.0.0.1:${m[1]}`,
    httpPort,
    httpBase: `http://127.0.0.1:${httpPort}`,
    stop: () => proc.stop('SIGTERM', 8000),
  };
}

/** The long flags thaw-scaler's --help lists (a Set of names without "--"). */
export async function scalerFlags() {
  const p = await spawnProcess(binPath('thaw-scaler'), ['--help'], { name: 'thaw-scaler --help' });
  await Promise.race([p.exited, new Promise((r) => setTimeout(r, 5000))]);
  if (p.exitCode === null) await p.kill();
  return new Set([...p.output().matchAll(/^\[std\w+\]\s+--([a-z0-9-]+)/gm)].map((m) => m[1]));
}

/** True when the activator binary exists and answers --help. */
export async function activatorAvailable() {
  const bin = binPath('thaw-activator');
  if (!fs.existsSync(bin)) return { ok: false, why: `${bin} does not exist (not built yet?)` };
  try {
    const p = await spawnProcess(bin, ['--help'], { name: 'thaw-activator --help' });
    const code = await Promise.race([p.exited, new Promise((r) => setTimeout(() => r('timeout'), 5000))]);
    if (code === 'timeout') {
      await p.kill();
      return { ok: false, why: `${bin} --help did not exit within 5 s` };
    }
    if (code !== 0) return { ok: false, why: `${bin} --help exited with ${code}` };
    return { ok: true };
  } catch (e) {
    return { ok: false, why: e.message };
  }
}

/**
 * Starts thaw-activator with a config routing each model to its endpoints
 * file. models: [{name, endpointsFile}]; modelDefaults: extra per-model keys.
 * Resolves to {proc, port, adminPort, base, adminBase, configFile, stop()}.
 */
export async function startActivator({ dir, redisUrl, scalerWakeUrl, models, modelDefaults = {}, limits = {} }) {
  const configFile = path.join(dir, 'activator.json');
  const config = {
    limits,
    defaults: { healthPath: '/health', ...modelDefaults },
    models: models.map((m) => ({ name: m.name, endpointsFile: m.endpointsFile })),
  };
  fs.writeFileSync(configFile, `${JSON.stringify(config, null, 2)}\n`);
  const proc = await spawnService(binPath('thaw-activator'), [
    '--config', configFile, '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0',
    '--redis-url', redisUrl, '--instance-id', 'demo-activator',
    // As in the base manifests: wakes also go straight to the scaler.
    ...(scalerWakeUrl ? ['--scaler-wake-url', scalerWakeUrl] : []),
  ], { name: 'thaw-activator', readyLogRegex: /event=listening proxy_port=\d+ admin_port=\d+/, timeoutMs: 15000 });
  const m = await proc.waitForLog(/event=listening proxy_port=(\d+) admin_port=(\d+)/);
  const port = Number(m[1]);
  const adminPort = Number(m[2]);
  const adminBase = `http://127.0.0.1:${adminPort}`;
  await waitUntil(async () => {
    const res = await fetch(`${adminBase}/healthz`);
    await res.arrayBuffer();
    return res.status === 200;
  }, 10000, { intervalMs: 100, what: 'thaw-activator /healthz' });
  return {
    proc,
    port,
    adminPort,
    base: `http://127.0.0.1:${port}`,
    adminBase,
    configFile,
    stop: () => proc.stop('SIGTERM', 15000),
  };
}
