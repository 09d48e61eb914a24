// One correctness probe for the load benchmarks, since h2load only checks the
// HTTP status and a gRPC error travels in the trailers of a 200 response.
//
//   node bench/lib/grpc_check.mjs HOST:PORT [--model m1] [--name bench]
//
// With a real gRPC client (grpc-js): GetMetricSpec (which also registers the
// ScaledObject with thaw-scaler), then GetMetrics. Prints one line
//   ok spec_metric=NAME target_size=N metric_value=N
// and exits 0, or prints the gRPC error and exits 1.

import { grpcClient } from '../../test/integration/lib/harness.mjs';

function parseArgs(argv) {
  const o = { address: null, model: 'm1', name: 'bench' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--model' || a === '--name') {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      o[a.slice(2)] = argv[++i];
    } else if (a.startsWith('--')) {
      throw new Error(`unknown option ${a}`);
    } else if (o.address === null) {
      o.address = a;
    } else {
      throw new Error(`unexpected argument ${a}`);
    }
  }
  if (!o.address) throw new Error('usage: grpc_check.mjs HOST:PORT [--model m1] [--name bench]');
  return o;
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const c = grpcClient(o.address, { deadlineMs: 5000 });
  try {
    const ref = { name: o.name, namespace: 'default', scalerMetadata: { model: o.model } };
    const spec = await c.getMetricSpec(ref);
    const ms = spec.metricSpecs?.[0];
    if (!ms) throw new Error('GetMetricSpec returned no metric spec');
    const res = await c.getMetrics({ scaledObjectRef: ref, metricName: o.model });
    const mv = res.metricValues?.[0];
    if (!mv) throw new Error('GetMetrics returned no metric value');
    process.stdout.write(`ok spec_metric=${ms.metricName} target_size=${ms.targetSize} metric_value=${mv.metricValue}\n`);
  } finally {
    c.close();
  }
}

main().catch((e) => {
  process.stdout.write(`error code=${e.code ?? '?'} ${e.details ?? e.message}\n`);
  process.exit(1);
});
