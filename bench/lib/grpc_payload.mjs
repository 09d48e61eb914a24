// gRPC request bodies for load generators that send a fixed body (h2load -d),
// and the proto loading shared by the Node benchmark peers.
//
// As a script:
//   node bench/lib/grpc_payload.mjs OUT_FILE [--method GetMetrics|IsActive|GetMetricSpec|StreamIsActive]
//        [--model m1] [--metric-name NAME] [--name bench] [--namespace default]
// writes one length-prefixed gRPC message (1 byte compressed flag = 0, 4 bytes
// big-endian length, then the protobuf) to OUT_FILE and prints its size and
// the request path to stdout. GetMetrics (the default) sends GetMetricsRequest
// {scaledObjectRef: {name, namespace, scalerMetadata: {model}}, metricName}
// with metricName defaulting to the model; the others send the
// ScaledObjectRef alone.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');

// Same options as test/integration/lib/harness.mjs: field names exactly as in
// the .proto files (already camelCase), int64 as numbers, enums as strings.
export const loaderOptions = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };

let loaded = null;

/** {grpc, packageDefinition, ExternalScaler, Health} from the repo's protos. */
export function loadScalerProto() {
  if (loaded) return loaded;
  const packageDefinition = protoLoader.loadSync(
    [path.join(repoRoot, 'proto', 'externalscaler.proto'), path.join(repoRoot, 'proto', 'health.proto')],
    loaderOptions);
  const root = grpc.loadPackageDefinition(packageDefinition);
  loaded = {
    grpc,
    packageDefinition,
    ExternalScaler: root.externalscaler.ExternalScaler,
    Health: root.grpc.health.v1.Health,
  };
  return loaded;
}

/** Protobuf bytes of the request of an ExternalScaler method. */
export function encodeRequest(method, message) {
  const { packageDefinition } = loadScalerProto();
  const m = packageDefinition['externalscaler.ExternalScaler'][method];
  if (!m) throw new Error(`unknown ExternalScaler method '${method}'`);
  return m.requestSerialize(message);
}

/** Prefixes a protobuf message with the 5-byte gRPC message header. */
export function grpcFrame(protobuf) {
  const head = Buffer.alloc(5);
  head.writeUInt8(0, 0);
  head.writeUInt32BE(protobuf.length, 1);
  return Buffer.concat([head, protobuf]);
}

/** The framed request body for method, built from a model name. */
export function requestBody({ method = 'GetMetrics', model = 'm1', metricName, name = 'bench', namespace = 'default' } = {}) {
  const ref = { name, namespace, scalerMetadata: { model } };
  const message = method === 'GetMetrics' ? { scaledObjectRef: ref, metricName: metricName ?? model } : ref;
  return grpcFrame(encodeRequest(method, message));
}

function main(argv) {
  const opts = {};
  let out = null;
  const flags = { '--method': 'method', '--model': 'model', '--metric-name': 'metricName', '--name': 'name', '--namespace': 'namespace' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (flags[a]) {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      opts[flags[a]] = argv[++i];
    } else if (a.startsWith('--')) {
      throw new Error(`unknown option ${a}`);
    } else if (out === null) {
      out = a;
    } else {
      throw new Error(`unexpected argument ${a}`);
    }
  }
  if (out === null) throw new Error('usage: grpc_payload.mjs OUT_FILE [--method M] [--model m1] [--metric-name N] [--name N] [--namespace NS]');
  const body = requestBody(opts);
  fs.writeFileSync(out, body);
  process.stdout.write(`wrote ${out} bytes=${body.length} path=/externalscaler.ExternalScaler/${opts.method ?? 'GetMetrics'}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  try {
    main(process.argv.slice(2));
  } catch (e) {
    process.stderr.write(`grpc_payload: ${e.message}\n`);
    process.exit(2);
  }
}
