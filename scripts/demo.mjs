// The interim local demo: real Redis, real Prometheus, fake vLLM exporter,
// thaw-scaler, and a KEDA-like client over real gRPC. Everything it starts is
// stopped on exit by the harness's process registry.
import {
  binPath, startRedis, startPrometheus, spawnProcess, grpcClient, freePort, tmpDir, waitUntil,
} from '../test/integration/lib/harness.mjs';
import fs from 'node:fs';
import path from 'node:path';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const say = (...a) => console.log(...a);

async function main() {
  const dir = tmpDir('thaw-demo-');
  say('== Thaw local demo (scaler): real Redis, real Prometheus, fake vLLM, real gRPC ==');
  const redis = await startRedis();
  say(`redis-server      127.0.0.1:${redis.port}`);

  const exporterPortFile = path.join(dir, 'exporter.port');
  const exporter = await spawnProcess(binPath('thaw-fake-vllm'), [
    '--exporter-only', '--models', 'llama-8b=0,mistral-7b=0', '--listen', '127.0.0.1:0',
    '--port-file', exporterPortFile,
  ], { readyLogRegex: /listening/ });
  await waitUntil(() => fs.existsSync(exporterPortFile) && fs.readFileSync(exporterPortFile, 'utf8').trim() !== '', 5000);
  const exporterPort = Number(fs.readFileSync(exporterPortFile, 'utf8').trim());
  say(`fake vLLM         127.0.0.1:${exporterPort} (vllm:generation_tokens_total per model)`);

  const prom = await startPrometheus({ scrapeTargets: [`127.0.0.1:${exporterPort}`], scrapeInterval: '1s' });
  say(`prometheus        127.0.0.1:${prom.port} (scrapes every 1 s)`);

  const scaler = await spawnProcess(binPath('thaw-scaler'), [
    '--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--redis-url', redis.url, '--prometheus-url', prom.url,
    '--token-rate-query', 'sum by (model_name) (rate(vllm:generation_tokens_total[10s]))',
    '--prometheus-interval-ms', '1000', '--redis-interval-ms', '500',
    '--scale-down-stabilization-seconds', '10',
  ], { readyLogRegex: /event=listening/ });
  const line = await scaler.waitForLog(/event=listening grpc_port=(\d+) http_port=(\d+)/, 5000);
  const m = /grpc_port=(\d+) http_port=(\d+)/.exec(line);
  const grpcPort = Number(m[1]);
  const httpPort = Number(m[2]);
  say(`thaw-scaler       gRPC 127.0.0.1:${grpcPort}, HTTP http://127.0.0.1:${httpPort}/models`);

  const keda = grpcClient(`127.0.0.1:${grpcPort}`);
  const ref = (model) => ({
    name: `${model}-so`, namespace: 'models',
    scalerMetadata: { scalerAddress: `127.0.0.1:${grpcPort}`, model, targetTokensPerSecond: '1000', targetQueueLength: '10' },
  });
  const poll = async (model) => {
    const spec = await keda.getMetricSpec(ref(model));
    const metrics = await keda.getMetrics({ scaledObjectRef: ref(model), metricName: spec.metricSpecs[0].metricName });
    const active = await keda.isActive(ref(model));
    return { desired: metrics.metricValues[0].metricValueFloat, active: active.result };
  };

  say('\n-- 1. both models idle: KEDA polls --');
  for (const model of ['llama-8b', 'mistral-7b']) say(`${model}: ${JSON.stringify(await poll(model))}`);

  say('\n-- 2. an activator holds a request for llama-8b and publishes a wake --');
  const stream = keda.streamIsActive(ref('llama-8b'));
  await sleep(200);
  await redis.cli('HSET', 'thaw:held:llama-8b', 'activator-0', `1:${Date.now()}`);
  const t0 = performance.now();
  await redis.cli('PUBLISH', 'thaw:wake', 'llama-8b');
  await stream.waitFor((msg) => msg.result === true, 2000);
  say(`StreamIsActive pushed true ${(performance.now() - t0).toFixed(1)} ms after starting redis-cli PUBLISH (KEDA scales 0 -> 1 now)`);
  say(`llama-8b: ${JSON.stringify(await poll('llama-8b'))}`);
  await redis.cli('DEL', 'thaw:held:llama-8b');

  say('\n-- 3. llama-8b now generates 2500 tokens/s: replicas follow the token rate --');
  await fetch(`http://127.0.0.1:${exporterPort}/admin/rate`, { method: 'POST', body: JSON.stringify({ model: 'llama-8b', rate: 2500 }) });
  await waitUntil(async () => (await poll('llama-8b')).desired >= 3, 30000, { intervalMs: 1000, what: 'desired >= 3' });
  say(`llama-8b: ${JSON.stringify(await poll('llama-8b'))}  (ceil(2500 / 1000) = 3)`);

  say('\n-- 4. 45 jobs queue up for mistral-7b in Redis: replicas follow the queue --');
  await redis.cli('RPUSH', 'thaw:queue:mistral-7b', ...Array.from({ length: 45 }, (_, i) => `job${i}`));
  await waitUntil(async () => (await poll('mistral-7b')).desired >= 5, 10000, { intervalMs: 250, what: 'desired >= 5' });
  say(`mistral-7b: ${JSON.stringify(await poll('mistral-7b'))}  (ceil(45 / 10) = 5)`);

  say('\n-- 5. why? the scaler explains every decision at /models --');
  const models = await (await fetch(`http://127.0.0.1:${httpPort}/models`)).json();
  for (const t of models) say(`${t.model}: desired=${t.desired} active=${t.active} reason=${t.reason} inputs=${JSON.stringify(t.inputs)}`);

  stream.cancel();
  keda.close?.();
  const code = await scaler.stop('SIGTERM', 5000);
  say(`\nthaw-scaler stopped with exit code ${code}; stopping redis, prometheus and the exporter.`);
  process.exit(code === 0 ? 0 : 1);
}

main().catch((err) => {
  console.error('demo failed:', err);
  process.exit(1);
});
