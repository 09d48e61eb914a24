// Reference KEDA external scaler in grpc-js, answering from memory, to compare
// thaw-scaler's gRPC throughput against under the same load generator.
//
//   node bench/ref-grpc-server.mjs [--port N] [--host 127.0.0.1] [--value 3]
//
// --port 0 (the default) picks a free port. Prints `listening port=N` once it
// accepts connections (plaintext HTTP/2, no TLS). SIGTERM/SIGINT shut it down,
// printing `served requests=N`, exit 0.
//
// Answers, for model = scalerMetadata.model (falling back to the metric name,
// then the ScaledObject name):
//   GetMetricSpec  one MetricSpec {metricName: model, targetSize 1}
//   GetMetrics     one MetricValue {metricName, value} (value from --value)
//   IsActive       result = value > 0
//   StreamIsActive the same once, then holds the stream open
//   grpc.health.v1.Health/Check  SERVING

import { loadScalerProto } from './lib/grpc_payload.mjs';

function parseArgs(argv) {
  const o = { port: 0, host: '127.0.0.1', value: 3 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = argv[i + 1];
    if (a === '--port') { o.port = Number(v); i++; }
    else if (a === '--host') { o.host = v; i++; }
    else if (a === '--value') { o.value = Number(v); i++; }
    else throw new Error(`unknown argument ${a}`);
    if (v === undefined) throw new Error(`${a} needs a value`);
  }
  if (!Number.isInteger(o.port) || o.port < 0 || o.port > 65535) throw new Error('--port must be 0..65535');
  if (!Number.isFinite(o.value)) throw new Error('--value must be a number');
  return o;
}

let opts;
try {
  opts = parseArgs(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`ref-grpc-server: ${e.message}\n`);
  process.exit(2);
}

const { grpc, ExternalScaler, Health } = loadScalerProto();
let served = 0;

const modelOf = (ref, metricName) =>
  (ref && ref.scalerMetadata && ref.scalerMetadata.model) || metricName || (ref && ref.name) || '';

const server = new grpc.Server();
server.addService(ExternalScaler.service, {
  GetMetricSpec(call, cb) {
    served++;
    cb(null, { metricSpecs: [{ metricName: modelOf(call.request), targetSize: 1, targetSizeFloat: 1 }] });
  },
  GetMetrics(call, cb) {
    served++;
    const name = call.request.metricName || modelOf(call.request.scaledObjectRef);
    cb(null, { metricValues: [{ metricName: name, metricValue: Math.round(opts.value), metricValueFloat: opts.value }] });
  },
  IsActive(call, cb) {
    served++;
    cb(null, { result: opts.value > 0 });
  },
  StreamIsActive(call) {
    served++;
    call.write({ result: opts.value > 0 });
  },
});
server.addService(Health.service, {
  Check(call, cb) { served++; cb(null, { status: 'SERVING' }); },
  Watch(call) { call.write({ status: 'SERVING' }); },
});

server.bindAsync(`${opts.host}:${opts.port}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) {
    process.stderr.write(`ref-grpc-server: bind ${opts.host}:${opts.port}: ${err.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`listening port=${port}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.once(sig, () => {
    const done = () => {
      process.stdout.write(`served requests=${served}\n`);
      process.exit(0);
    };
    server.tryShutdown(done);
    // Open streams (StreamIsActive) would hold tryShutdown forever.
    setTimeout(() => { server.forceShutdown(); done(); }, 2000).unref();
  });
}
