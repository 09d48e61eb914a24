// manifests/ and the Containerfiles, offline:
//   - the three kustomizations build (a small builder, manifests_lib.mjs; the
//     same output as `kubectl kustomize` wherever kubectl is installed);
//   - every object validates strictly against the Kubernetes, KEDA and
//     prometheus-operator schemas (kubernetes-models packages), and the
//     validator demonstrably rejects unknown fields and wrong types;
//   - cross-references hold (selectors, ports, probe ports, scalerAddress,
//     activator backends, monitors), and the Deployments follow the rules
//     the issue sets (non-root, read-only root, no token, resources, ...);
//   - the configs inside the ConfigMaps and the ScaledObjects' trigger
//     metadata are accepted by the real thaw-scaler and thaw-activator;
//   - the rules pass promtool check rules / promtool test rules, and the
//     PrometheusRule carries exactly the plain rule file's groups;
//   - the Containerfiles copy every source directory meson needs and install
//     every shared library the built binaries link.
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import YAML from 'yaml';

import { binPath, buildDir, freePort, grpcClient, repoRoot, spawnProcess, tmpDir } from './lib/harness.mjs';
import {
  buildKustomization, loadYamlDocs, manifestsDir, objectId, selects, validateObject,
} from './manifests_lib.mjs';

const KUSTOMIZATIONS = ['base', 'monitoring', 'examples/llama', 'networkpolicy'];
const built = {};
for (const k of KUSTOMIZATIONS) built[k] = buildKustomization(path.join(manifestsDir, k));
// The example overlay holds base and monitoring too: it is the full install.
const all = built['examples/llama'];

const byKind = (kind, objs = all) => objs.filter((o) => o.kind === kind);
const find = (kind, name, ns) => all.find((o) => o.kind === kind && o.metadata.name === name &&
  (ns === undefined || o.metadata.namespace === ns));
const podLabels = (d) => d.spec.template.metadata.labels;
const containerPorts = (podSpec) => podSpec.containers.flatMap((c) => c.ports ?? []);

function run(cmd, args, opts = {}) {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: 60000, ...opts }, (err, stdout, stderr) =>
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, out: stdout + stderr }));
  });
}

function hasKubectl() {
  try {
    execFileSync('kubectl', ['version', '--client'], { stdio: 'ignore', timeout: 20000 });
    return true;
  } catch {
    return false;
  }
}

test('kustomize: the base, monitoring and example kustomizations build', () => {
  const kinds = (objs) => objs.map((o) => `${o.kind}/${o.metadata.name}`).sort();
  assert.ok(kinds(built.base).includes('Namespace/thaw-system'));
  for (const o of built.base) {
    if (o.kind !== 'Namespace') assert.equal(o.metadata.namespace, 'thaw-system', objectId(o));
    assert.equal(o.metadata.labels?.['app.kubernetes.io/part-of'], 'thaw', objectId(o));
  }
  for (const want of ['Deployment/thaw-scaler', 'Service/thaw-scaler', 'ConfigMap/thaw-scaler',
    'Deployment/thaw-activator', 'Service/thaw-activator', 'ConfigMap/thaw-activator',
    'Deployment/thaw-redis', 'Service/thaw-redis',
    'PodDisruptionBudget/thaw-scaler', 'PodDisruptionBudget/thaw-activator',
    'HorizontalPodAutoscaler/thaw-activator']) {
    assert.ok(kinds(built.base).includes(want), `base lacks ${want}`);
  }
  for (const want of ['ServiceMonitor/thaw-scaler', 'PodMonitor/thaw-activator',
    'PodMonitor/thaw-model-servers', 'PrometheusRule/thaw', 'ConfigMap/thaw-grafana-dashboard']) {
    assert.ok(kinds(built.monitoring).includes(want), `monitoring lacks ${want}`);
  }
  for (const want of ['Namespace/models', 'Deployment/llama-8b', 'Service/qwen-7b',
    'Service/llama-8b-headless', 'ScaledObject/llama-8b', 'ScaledObject/qwen-7b',
    'TriggerAuthentication/thaw-scaler-tls', 'Deployment/thaw-scaler-tls']) {
    assert.ok(kinds(all).includes(want), `example lacks ${want}`);
  }
  // The images are rewritten by the base's images entries.
  const scaler = find('Deployment', 'thaw-scaler');
  assert.equal(scaler.spec.template.spec.containers[0].image, 'registry.example.com/thaw/thaw-scaler:0.1.0');
  // The overlay's patch replaced the activator's model list.
  const cfg = JSON.parse(find('ConfigMap', 'thaw-activator').data['activator.json']);
  assert.deepEqual(cfg.models.map((m) => m.name), ['llama-8b', 'qwen-7b']);
});

test('kustomize: the builder produces what kubectl kustomize produces', (t) => {
  if (!hasKubectl()) {
    t.skip('kubectl is not installed: the builder is checked by the other tests only');
    return;
  }
  for (const k of KUSTOMIZATIONS) {
    const out = execFileSync('kubectl', ['kustomize', path.join(manifestsDir, k)],
      { encoding: 'utf8', timeout: 60000 });
    const theirs = YAML.parseAllDocuments(out).map((d) => d.toJS()).filter(Boolean);
    const mine = new Map(built[k].map((o) => [objectId(o), o]));
    assert.deepEqual([...mine.keys()].sort(), theirs.map(objectId).sort(), `${k}: resource sets differ`);
    for (const o of theirs) assert.deepEqual(mine.get(objectId(o)), o, `${k}: ${objectId(o)} differs`);
  }
});

test('kustomize: the builder refuses kustomization features it does not implement', () => {
  const dir = tmpDir('thaw-kust-');
  fs.writeFileSync(path.join(dir, 'cm.yaml'), 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n');
  fs.writeFileSync(path.join(dir, 'kustomization.yaml'),
    'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [cm.yaml]\nnamePrefix: a-\n');
  assert.throws(() => buildKustomization(dir), /unsupported kustomization keys: namePrefix/);
});

test('schemas: every object validates against its Kubernetes, KEDA or prometheus-operator schema', async (t) => {
  const seen = new Map();
  for (const k of KUSTOMIZATIONS) for (const o of built[k]) seen.set(`${k}:${objectId(o)}`, o);
  const failures = [];
  const kinds = new Set();
  for (const [id, o] of seen) {
    kinds.add(`${o.apiVersion} ${o.kind}`);
    const errors = await validateObject(o);
    if (errors.length) failures.push(`${id}:\n  ${errors.join('\n  ')}`);
  }
  t.diagnostic(`${seen.size} objects validated, kinds: ${[...kinds].sort().join(', ')}`);
  assert.deepEqual(failures, []);
  for (const want of ['apps/v1 Deployment', 'v1 Service', 'v1 ConfigMap', 'policy/v1 PodDisruptionBudget',
    'keda.sh/v1alpha1 ScaledObject', 'keda.sh/v1alpha1 TriggerAuthentication',
    'monitoring.coreos.com/v1 ServiceMonitor', 'monitoring.coreos.com/v1 PodMonitor',
    'monitoring.coreos.com/v1 PrometheusRule', 'networking.k8s.io/v1 NetworkPolicy',
    'autoscaling/v2 HorizontalPodAutoscaler']) {
    assert.ok(kinds.has(want), `no ${want} was validated`);
  }
});

test('schemas: the validator rejects unknown fields, wrong types and unknown kinds', async () => {
  const d = structuredClone(find('Deployment', 'thaw-scaler'));
  d.spec.template.spec.containers[0].imagee = 'x';
  d.spec.template.spec.containers[0].readinessProbe.grpc.port = 'grpc';
  let errors = await validateObject(d);
  assert.ok(errors.some((e) => /containers\/0: unknown field "imagee"/.test(e)), errors.join('\n'));
  assert.ok(errors.some((e) => /readinessProbe\/grpc\/port type/.test(e)), errors.join('\n'));

  const so = structuredClone(find('ScaledObject', 'llama-8b'));
  so.spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilisationWindowSeconds = 0;
  so.spec.triggers[0].metadata.targetTokensPerSecond = 1500;   // KEDA wants strings
  errors = await validateObject(so);
  assert.ok(errors.some((e) => /unknown field "stabilisationWindowSeconds"/.test(e)), errors.join('\n'));
  assert.ok(errors.some((e) => /metadata\/targetTokensPerSecond type/.test(e)), errors.join('\n'));

  const pr = structuredClone(find('PrometheusRule', 'thaw'));
  pr.spec.groups[0].rules[0].recrd = 'x';
  errors = await validateObject(pr);
  assert.ok(errors.some((e) => /unknown field "recrd"/.test(e)), errors.join('\n'));

  const sm = structuredClone(find('ServiceMonitor', 'thaw-scaler'));
  sm.spec.endpoints[0].honorLabels = 'yes';
  errors = await validateObject(sm);
  assert.ok(errors.some((e) => /honorLabels type/.test(e)), errors.join('\n'));

  await assert.rejects(validateObject({ apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'x' } }),
    /no schema package/);
});

test('refs: Deployments: selectors, security, resources, service account tokens', () => {
  for (const d of byKind('Deployment')) {
    const id = objectId(d);
    const spec = d.spec.template.spec;
    assert.ok(selects(d.spec.selector.matchLabels, podLabels(d)), `${id}: selector does not match its pods`);
    assert.equal(spec.automountServiceAccountToken, false, `${id}: mounts a service-account token`);
    for (const c of spec.containers) {
      assert.ok(c.resources?.requests?.memory && c.resources?.limits?.memory, `${id}/${c.name}: memory request and limit`);
      assert.ok(c.resources.requests.cpu, `${id}/${c.name}: cpu request`);
      assert.equal(c.securityContext?.allowPrivilegeEscalation, false, `${id}/${c.name}: privilege escalation`);
      assert.ok(c.readinessProbe, `${id}/${c.name}: no readiness probe`);
    }
    if (d.metadata.namespace !== 'thaw-system') continue;
    // Thaw's own pods: non-root, read-only root filesystem, no capabilities.
    assert.equal(spec.securityContext?.runAsNonRoot, true, `${id}: runAsNonRoot`);
    assert.ok(spec.securityContext.runAsUser > 0, `${id}: runAsUser`);
    for (const c of spec.containers) {
      assert.equal(c.securityContext.readOnlyRootFilesystem, true, `${id}/${c.name}: read-only root`);
      assert.deepEqual(c.securityContext.capabilities?.drop, ['ALL'], `${id}/${c.name}: capabilities`);
    }
  }
  const scaler = find('Deployment', 'thaw-scaler', 'thaw-system');
  assert.equal(scaler.spec.replicas, 2);
  const c = scaler.spec.template.spec.containers[0];
  const grpcPort = c.ports.find((p) => p.name === 'grpc').containerPort;
  for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    assert.equal(c[probe]?.grpc?.port, grpcPort, `thaw-scaler ${probe} is a gRPC probe on the gRPC port`);
  }
  assert.deepEqual(c.args, ['--config', '/etc/thaw/scaler.json']);
  // The activator autoscales on its CPU: the HPA's target exists and leaves
  // its replicas to it (an apply would otherwise reset them), every container
  // has a CPU request (a Utilization target needs one), and a node drain
  // takes one at a time, leaving at least one of the minimum.
  for (const [label, objs] of [['base', built.base], ['example', all]]) {
    const hpa = objs.find((o) => o.kind === 'HorizontalPodAutoscaler' && o.metadata.name === 'thaw-activator');
    assert.ok(hpa, `${label}: the activator's HorizontalPodAutoscaler`);
    const ref = hpa.spec.scaleTargetRef;
    const target = objs.find((o) => o.apiVersion === ref.apiVersion && o.kind === ref.kind &&
      o.metadata.name === ref.name && o.metadata.namespace === hpa.metadata.namespace);
    assert.ok(target, `${label}: the HPA's target ${ref.kind}/${ref.name} is not in the build`);
    assert.equal(target.metadata.name, 'thaw-activator');
    assert.equal(target.spec.replicas, undefined, `${label}: the HPA's Deployment must leave replicas to it`);
    for (const ctr of target.spec.template.spec.containers) {
      assert.ok(ctr.resources?.requests?.cpu, `${label}/${ctr.name}: no CPU request for the HPA's utilisation`);
    }
    assert.ok(hpa.spec.metrics.some((m) => m.type === 'Resource' && m.resource.name === 'cpu'), `${label}: scales on CPU`);
    const pdb = objs.find((o) => o.kind === 'PodDisruptionBudget' && o.metadata.name === 'thaw-activator');
    assert.equal(pdb.spec.maxUnavailable, 1, `${label}: the PDB lets a drain take one activator at a time`);
    assert.equal(pdb.spec.minAvailable, undefined, `${label}: a PDB has one of minAvailable and maxUnavailable`);
    assert.ok(hpa.spec.minReplicas >= 2, `${label}: minReplicas ${hpa.spec.minReplicas}: one left during a drain`);
    assert.ok(hpa.spec.maxReplicas > hpa.spec.minReplicas, `${label}: room to scale`);
  }
  // A stopping activator (rollout, node drain) lets held requests wait their
  // whole hold and streams finish: drainTimeoutSeconds covers every
  // holdTimeoutSeconds, and the grace covers preStop + drain + the 5 s hard
  // stop the activator allows itself after the drain deadline.
  for (const [label, objs] of [['base', built.base], ['example', all]]) {
    const act = objs.find((o) => o.kind === 'Deployment' && o.metadata.name === 'thaw-activator');
    const cfg = JSON.parse(objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'thaw-activator')
      .data['activator.json']);
    const drain = cfg.limits?.drainTimeoutSeconds ?? 30;
    const holds = [cfg.defaults?.holdTimeoutSeconds ?? 600,
      ...cfg.models.map((m) => m.holdTimeoutSeconds ?? cfg.defaults?.holdTimeoutSeconds ?? 600)];
    assert.ok(drain >= Math.max(...holds),
      `${label}: drainTimeoutSeconds ${drain} < the longest holdTimeoutSeconds ${Math.max(...holds)}`);
    const pre = act.spec.template.spec.containers[0].lifecycle?.preStop?.exec?.command ?? [];
    const preStop = pre[0] === 'sleep' ? Number(pre[1]) : 0;
    const grace = act.spec.template.spec.terminationGracePeriodSeconds;
    assert.ok(grace >= preStop + drain + 5,
      `${label}: grace ${grace} s < preStop ${preStop} + drain ${drain} + 5 s: held requests and streams cut by SIGKILL`);
  }
  // Model pods: vLLM finishes its requests after SIGTERM, within the grace.
  for (const so of byKind('ScaledObject')) {
    const dep = find('Deployment', so.spec.scaleTargetRef.name, so.metadata.namespace);
    assert.ok(dep.spec.template.spec.terminationGracePeriodSeconds >= 300,
      `${objectId(dep)}: a grace under 300 s cuts long generations at scale-down`);
  }
});

test('refs: Services, PDBs and monitors select existing pods and ports', () => {
  for (const s of byKind('Service')) {
    const pods = byKind('Deployment').filter((d) => d.metadata.namespace === s.metadata.namespace &&
      selects(s.spec.selector, podLabels(d)));
    assert.equal(pods.length, 1, `${objectId(s)} selects ${pods.length} Deployments`);
    const names = containerPorts(pods[0].spec.template.spec).map((p) => p.name);
    for (const p of s.spec.ports) {
      assert.ok(typeof p.targetPort !== 'string' || names.includes(p.targetPort),
        `${objectId(s)}: targetPort ${p.targetPort} is not a container port of ${pods[0].metadata.name}`);
    }
  }
  for (const p of byKind('PodDisruptionBudget')) {
    assert.ok(byKind('Deployment').some((d) => d.metadata.namespace === p.metadata.namespace &&
      selects(p.spec.selector.matchLabels, podLabels(d))), `${objectId(p)} selects no pods`);
  }
  for (const sm of byKind('ServiceMonitor')) {
    const svcs = byKind('Service').filter((s) => s.metadata.namespace === sm.metadata.namespace &&
      selects(sm.spec.selector.matchLabels, s.metadata.labels));
    assert.equal(svcs.length, 1, `${objectId(sm)} selects ${svcs.length} Services`);
    for (const e of sm.spec.endpoints) {
      assert.ok(svcs[0].spec.ports.some((p) => p.name === e.port), `${objectId(sm)}: no port ${e.port}`);
    }
  }
  assert.equal(find('ServiceMonitor', 'thaw-scaler').spec.endpoints[0].honorLabels, true,
    'the scaler\'s namespace label (the ScaledObject\'s) must survive the scrape');
  const pm = find('PodMonitor', 'thaw-model-servers');
  const models = byKind('Deployment').filter((d) => selects(pm.spec.selector.matchLabels, podLabels(d)));
  assert.deepEqual(models.map((d) => d.metadata.name).sort(), ['llama-8b', 'qwen-7b']);
  for (const d of models) {
    const names = containerPorts(d.spec.template.spec).map((p) => p.name);
    assert.ok(names.includes(pm.spec.podMetricsEndpoints[0].port), `${d.metadata.name}: no metrics port`);
  }
});

test('refs: ScaledObjects: targets, scaler addresses, metadata keys, HPA behaviour, TLS', () => {
  const readme = fs.readFileSync(path.join(repoRoot, 'README.md'), 'utf8');
  const section = readme.split('### ScaledObject trigger metadata')[1].split('\n\n').find((p) => p.startsWith('| key'));
  const documented = [...section.matchAll(/^\| `([A-Za-z]+)` \|/gm)].map((m) => m[1]);
  assert.ok(documented.length >= 7 && documented.includes('model'), `README keys: ${documented}`);

  const resolveAddress = (addr) => {
    const [host, port] = addr.split(':');
    const [name, ns] = host.split('.');
    const svc = find('Service', name, ns);
    assert.ok(svc, `scalerAddress ${addr}: no Service ${name} in ${ns}`);
    assert.ok(svc.spec.ports.some((p) => p.port === Number(port)), `scalerAddress ${addr}: no port ${port}`);
    return svc;
  };
  for (const so of byKind('ScaledObject')) {
    const id = objectId(so);
    const target = find('Deployment', so.spec.scaleTargetRef.name, so.metadata.namespace);
    assert.ok(target, `${id}: no Deployment ${so.spec.scaleTargetRef.name}`);
    assert.equal(target.spec.replicas, undefined, `${id}: its Deployment must leave replicas to KEDA`);
    assert.equal(so.spec.minReplicaCount, 0, `${id}: scale to zero`);
    // Policy v2's keep-warm is the idle time: KEDA's cooldown is set, to 0.
    assert.ok(so.spec.cooldownPeriod === 0 && so.spec.fallback?.replicas >= 1, `${id}: cooldown and fallback`);
    // An outage must not cut a busy model to the fallback's count.
    assert.equal(so.spec.fallback.behavior, 'currentReplicasIfHigher', `${id}: fallback behavior`);
    assert.equal(so.spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds, 0,
      `${id}: Thaw stabilizes; the HPA must not`);
    for (const tr of so.spec.triggers) resolveAddress(tr.metadata.scalerAddress);
  }
  const push = find('ScaledObject', 'llama-8b').spec.triggers[0];
  assert.equal(push.type, 'external-push');
  assert.equal(push.metadata.scalerAddress, 'thaw-scaler.thaw-system:9090');
  for (const k of documented) assert.ok(k in push.metadata, `external-push example lacks metadata key ${k}`);

  const tls = find('ScaledObject', 'qwen-7b').spec.triggers[0];
  assert.equal(tls.type, 'external');
  assert.equal(tls.metadata.enableTLS, 'true');
  const ta = find('TriggerAuthentication', tls.authenticationRef.name, 'models');
  assert.ok(ta, 'the TLS trigger\'s TriggerAuthentication exists');
  assert.deepEqual(ta.spec.secretTargetRef.map((r) => r.parameter).sort(), ['caCert', 'tlsClientCert', 'tlsClientKey']);
  // The TLS proxy forwards to the scaler's gRPC Service.
  const nginx = find('ConfigMap', 'thaw-scaler-tls').data['nginx.conf'];
  const upstream = /server (\S+)\.svc:(\d+);/.exec(nginx);
  resolveAddress(`${upstream[1]}:${upstream[2]}`);
  assert.match(nginx, new RegExp(`listen ${tls.metadata.scalerAddress.split(':')[1]} ssl http2;`));
});

test('refs: NetworkPolicies select Thaw\'s pods and ports, and admit every caller Thaw has', () => {
  const pols = built.networkpolicy.filter((o) => o.kind === 'NetworkPolicy');
  const thawDeps = byKind('Deployment').filter((d) => d.metadata.namespace === 'thaw-system');
  const depOf = (sel) => thawDeps.filter((d) => selects(sel.matchLabels, podLabels(d)));
  for (const p of pols) {
    const id = objectId(p);
    assert.equal(p.metadata.namespace, 'thaw-system', id);
    const targets = depOf(p.spec.podSelector);
    assert.equal(targets.length, 1, `${id} selects ${targets.length} Deployments`);
    const names = containerPorts(targets[0].spec.template.spec).map((x) => x.name);
    for (const rule of p.spec.ingress) {
      for (const port of rule.ports) assert.ok(names.includes(port.port), `${id}: no port ${port.port} on its pods`);
      for (const peer of rule.from.filter((f) => f.podSelector)) {
        assert.equal(depOf(peer.podSelector).length, 1, `${id}: a podSelector that selects no Thaw pod`);
      }
    }
  }
  // Every in-cluster connection Thaw makes to a pod a policy guards, from the
  // example install: [client Deployment, target Deployment, target port name].
  const needed = [['thaw-scaler', 'thaw-redis', 'redis'], ['thaw-activator', 'thaw-redis', 'redis'],
    ['thaw-activator', 'thaw-scaler', 'http-metrics'], ['thaw-scaler-tls', 'thaw-scaler', 'grpc']];
  const admits = (from, to, port) => pols.some((p) =>
    selects(p.spec.podSelector.matchLabels, podLabels(find('Deployment', to, 'thaw-system'))) &&
    p.spec.ingress.some((r) => r.ports.some((x) => x.port === port) &&
      r.from.some((f) => f.podSelector && selects(f.podSelector.matchLabels, podLabels(find('Deployment', from, 'thaw-system'))))));
  for (const [from, to, port] of needed) assert.ok(admits(from, to, port), `${from} -> ${to}:${port} is not admitted`);
  assert.ok(!admits('thaw-activator', 'thaw-scaler', 'grpc'), 'the activators have no business on the gRPC port');
  // The activator's wake URL and Redis URL go to the ports admitted above.
  const actEnv = Object.fromEntries(find('Deployment', 'thaw-activator', 'thaw-system').spec.template.spec
    .containers[0].env.filter((e) => e.value).map((e) => [e.name, e.value]));
  assert.match(actEnv.THAW_SCALER_WAKE_URL, /:9091$/);
  assert.match(actEnv.THAW_REDIS_URL, /:6379$/);
  // KEDA's and Prometheus's namespaces are the two the kustomization says to check.
  const nsNames = pols.flatMap((p) => p.spec.ingress.flatMap((r) => r.from))
    .filter((f) => f.namespaceSelector).map((f) => f.namespaceSelector.matchLabels['kubernetes.io/metadata.name']);
  assert.deepEqual([...new Set(nsNames)].sort(), ['keda', 'monitoring']);
});

test('refs: a model whose ScaledObject says idleSignal activators has no Service but the activators\' headless one', () => {
  // Traffic the activators do not carry is invisible to that idle signal: a
  // Service for clients to bypass them would get the model scaled to zero
  // under its clients.
  const cfg = JSON.parse(find('ConfigMap', 'thaw-activator').data['activator.json']);
  const backends = new Set(cfg.models.map((m) => new URL(m.backend).hostname.split('.')[0]));
  let checked = 0;
  for (const so of byKind('ScaledObject')) {
    if (so.spec.triggers[0].metadata.idleSignal !== 'activators') continue;
    const dep = find('Deployment', so.spec.scaleTargetRef.name, so.metadata.namespace);
    const svcs = byKind('Service').filter((s) => s.metadata.namespace === so.metadata.namespace &&
      s.spec.selector && selects(s.spec.selector, podLabels(dep)));
    assert.deepEqual(svcs.map((s) => s.metadata.name).filter((n) => !backends.has(n)), [],
      `${so.metadata.name}: Services other than the activators' backend select its pods`);
    checked++;
  }
  assert.ok(checked >= 1, 'the example has a ScaledObject with idleSignal activators');
});

test('refs: activator backends are headless Services of the example models', () => {
  const cfg = JSON.parse(find('ConfigMap', 'thaw-activator').data['activator.json']);
  for (const m of cfg.models) {
    const u = new URL(m.backend);
    const [name, ns] = u.hostname.split('.');
    const svc = find('Service', name, ns);
    assert.ok(svc, `${m.name}: no Service ${name}.${ns}`);
    assert.equal(svc.spec.clusterIP, 'None', `${m.name}: backend must be headless (one endpoint per pod)`);
    assert.ok(svc.spec.ports.some((p) => p.port === Number(u.port)), `${m.name}: port ${u.port}`);
    const so = byKind('ScaledObject').find((s) => s.spec.triggers[0].metadata.model === m.name);
    assert.ok(so, `${m.name}: no ScaledObject scales it`);
    const dep = find('Deployment', so.spec.scaleTargetRef.name, ns);
    assert.ok(selects(svc.spec.selector, podLabels(dep)), `${m.name}: the Service does not select the scaled pods`);
    const args = dep.spec.template.spec.containers[0].args;
    assert.ok(args.includes(`--served-model-name=${m.name}`), `${m.name}: vLLM serves another name`);
  }
});

let client;
after(() => client?.close());

test('binaries: thaw-scaler starts with its ConfigMap and accepts every ScaledObject\'s metadata', async () => {
  const dir = tmpDir('thaw-manifest-scaler-');
  const cfgText = find('ConfigMap', 'thaw-scaler').data['scaler.json'];
  const cfg = JSON.parse(cfgText);
  fs.writeFileSync(path.join(dir, 'scaler.json'), cfgText);
  const dead = `127.0.0.1:${await freePort()}`;
  // Flags beat the config file: local addresses, everything else as shipped.
  const proc = await spawnProcess(binPath('thaw-scaler'), ['--config', path.join(dir, 'scaler.json'),
    '--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
    '--prometheus-url', `http://${dead}`, '--redis-url', `redis://${dead}`], {
    name: 'thaw-scaler', readyLogRegex: /event=listening grpc_port=\d+/, timeoutMs: 15000,
  });
  const m = await proc.waitForLog(/event=listening grpc_port=(\d+) .*query=(.*)$/);
  assert.equal(m[2].replace(/^"|"$/g, ''), cfg.tokenRateQuery, 'the scaler runs the configured query');
  client = grpcClient(`127.0.0.1:${m[1]}`);
  for (const so of byKind('ScaledObject')) {
    const ref = { name: so.metadata.name, namespace: so.metadata.namespace, scalerMetadata: so.spec.triggers[0].metadata };
    const spec = await client.getMetricSpec(ref);
    assert.equal(spec.metricSpecs.length, 1);
    assert.equal(spec.metricSpecs[0].metricName, `thaw-${so.spec.triggers[0].metadata.model}`);
  }
  // The same call with a broken value is refused: the check above can fail.
  const bad = find('ScaledObject', 'llama-8b');
  await assert.rejects(client.getMetricSpec({ name: 'x', namespace: 'models',
    scalerMetadata: { ...bad.spec.triggers[0].metadata, targetTokensPerSecond: 'fast' } }),
  (e) => e.code === 3 && /targetTokensPerSecond/.test(e.details));
  client.close();
  client = null;
  assert.equal(await proc.stop('SIGTERM', 8000), 0);
});

for (const [label, objs] of [['base', built.base], ['example', all]]) {
  test(`binaries: thaw-activator starts with the ${label} ConfigMap`, async () => {
    const dir = tmpDir('thaw-manifest-act-');
    const text = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'thaw-activator').data['activator.json'];
    fs.writeFileSync(path.join(dir, 'activator.json'), text);
    const proc = await spawnProcess(binPath('thaw-activator'), ['--config', path.join(dir, 'activator.json'),
      '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--instance-id', 'manifest-test'], {
      name: 'thaw-activator', readyLogRegex: /event=listening/, timeoutMs: 15000,
    });
    const m = await proc.waitForLog(/event=listening proxy_port=(\d+) admin_port=(\d+)/);
    const res = await fetch(`http://127.0.0.1:${m[2]}/models`);
    const body = await res.json();
    const names = (body.models ?? body).map((x) => x.name).sort();
    assert.deepEqual(names, JSON.parse(text).models.map((x) => x.name).sort());
    assert.equal(await proc.stop('SIGTERM', 10000), 0);
  });
}

const rulesFile = path.join(manifestsDir, 'prometheus', 'thaw-rules.yaml');
const plain = loadYamlDocs(rulesFile)[0];

test('rules: the PrometheusRule carries exactly the plain rule file\'s groups', () => {
  assert.deepEqual(find('PrometheusRule', 'thaw').spec, plain);
});

test('rules: promtool check rules (plain file and the PrometheusRule\'s groups)', async () => {
  let r = await run('promtool', ['check', 'rules', rulesFile]);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /SUCCESS: \d+ rules found/);
  const dir = tmpDir('thaw-rules-');
  const extracted = path.join(dir, 'prometheusrule-groups.yaml');
  fs.writeFileSync(extracted, YAML.stringify(find('PrometheusRule', 'thaw').spec));
  r = await run('promtool', ['check', 'rules', extracted]);
  assert.equal(r.code, 0, r.out);
  // A broken rule file fails the same check.
  const broken = path.join(dir, 'broken.yaml');
  fs.writeFileSync(broken, fs.readFileSync(rulesFile, 'utf8').replace('sum by (namespace, model_name) (rate(', 'sum by (namespace, model_name) (rate(('));
  r = await run('promtool', ['check', 'rules', broken]);
  assert.notEqual(r.code, 0, 'promtool accepted a broken rule file');
});

test('rules: promtool test rules', async () => {
  const r = await run('promtool', ['test', 'rules', path.join(manifestsDir, 'prometheus', 'thaw-rules.test.yaml')]);
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /SUCCESS/);
});

test('rules: the scaler\'s token-rate query and the alerts use what the rules and the scaler define', () => {
  const records = new Set(plain.groups.flatMap((g) => g.rules.filter((x) => x.record).map((x) => x.record)));
  const query = JSON.parse(find('ConfigMap', 'thaw-scaler').data['scaler.json']).tokenRateQuery;
  const used = [...query.matchAll(/[a-z_]+:[a-z_:0-9]+/g)].map((x) => x[0]);
  assert.ok(used.length > 0 && used.every((u) => records.has(u)), `query ${query} reads no recorded series`);
  // The staleness alert's threshold is the scaler's configured limit.
  const limit = JSON.parse(find('ConfigMap', 'thaw-scaler').data['scaler.json']).stalenessLimitSeconds;
  const alert = plain.groups.flatMap((g) => g.rules).find((x) => x.alert === 'ThawScalerFallbackActive');
  assert.equal(alert.expr, `thaw_scaler_source_staleness_seconds > ${limit}`);
  // Job names in the absent() alerts: the scaler's ServiceMonitor's Service,
  // the activator's PodMonitor's jobLabel value on its pods.
  for (const job of ['thaw-scaler', 'thaw-activator']) {
    assert.ok(plain.groups.flatMap((g) => g.rules).some((x) => x.expr.includes(`up{job="${job}"}`)));
  }
  assert.ok(find('ServiceMonitor', 'thaw-scaler') && find('Service', 'thaw-scaler', 'thaw-system'));
  const apm = find('PodMonitor', 'thaw-activator');
  const act = find('Deployment', 'thaw-activator', 'thaw-system');
  assert.ok(selects(apm.spec.selector.matchLabels, podLabels(act)), 'the PodMonitor selects the activator pods');
  assert.equal(podLabels(act)[apm.spec.jobLabel], 'thaw-activator', 'its job is named thaw-activator');
  assert.ok(containerPorts(act.spec.template.spec).some((p) => p.name === apm.spec.podMetricsEndpoints[0].port));
  assert.equal(apm.spec.podMetricsEndpoints[0].honorLabels, true);
});

test('rules: the dashboard ConfigMap carries the dashboard file', () => {
  const cm = find('ConfigMap', 'thaw-grafana-dashboard');
  assert.equal(cm.metadata.labels.grafana_dashboard, '1');
  assert.equal(cm.data['thaw.json'], fs.readFileSync(path.join(manifestsDir, 'monitoring', 'dashboards', 'thaw.json'), 'utf8'));
});

const mesonSubdirs = [...fs.readFileSync(path.join(repoRoot, 'meson.build'), 'utf8').matchAll(/^subdir\('([^']+)'\)/gm)]
  .map((m) => m[1]);

// The package of every library the binary links directly (its NEEDED
// entries; apt brings their own dependencies), found where ldd resolves it.
function packagesOf(binary) {
  // Sanitizer runtimes belong to the ASan+UBSan test build, not to an image.
  const needed = new Set([...execFileSync('readelf', ['-d', binary], { encoding: 'utf8' })
    .matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1])
    .filter((lib) => !/^lib(asan|ubsan|lsan|tsan)\.so/.test(lib)));
  assert.ok(needed.size > 0, `${binary}: no NEEDED entries`);
  const out = execFileSync('ldd', [binary], { encoding: 'utf8' });
  const pkgs = new Map();
  for (const line of out.split('\n')) {
    const m = /^\s*(\S+) => (\S+)/.exec(line);
    if (!m || !needed.has(m[1])) continue;
    const candidates = [m[2], fs.realpathSync(m[2]), m[2].replace(/^\/usr/, ''), `/usr${m[2]}`];
    let pkg = null;
    for (const c of candidates) {
      try {
        pkg = execFileSync('dpkg', ['-S', c], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).split(':')[0];
        break;
      } catch { /* try the next spelling */ }
    }
    assert.ok(pkg, `no Debian package owns ${m[2]}`);
    pkgs.set(m[1], pkg);
  }
  assert.deepEqual([...pkgs.keys()].sort(), [...needed].sort(), `${binary}: ldd did not resolve every NEEDED library`);
  return pkgs;
}

for (const [file, exe, subdir] of [['Containerfile.scaler', 'thaw-scaler', 'scaler'],
  ['Containerfile.activator', 'thaw-activator', 'activator']]) {
  test(`Containerfiles: ${file}: multi-stage, slim, non-root, complete`, () => {
    const text = fs.readFileSync(path.join(repoRoot, file), 'utf8');
    const froms = [...text.matchAll(/^FROM (\S+)/gm)].map((m) => m[1]);
    assert.equal(froms.length, 2, 'two stages');
    assert.match(text, /^ARG DEBIAN_IMAGE=docker\.io\/library\/debian:12-slim$/m);
    assert.match(text, /RUN THAW_SKIP_NPM=1 bash scripts\/install-deps\.sh/);
    assert.ok(fs.existsSync(path.join(repoRoot, 'scripts', 'install-deps.sh')));
    const copied = new Set([...text.matchAll(/^COPY (?!--from)(.+) \S+$/gm)].flatMap((m) => m[1].split(/\s+/)));
    for (const d of [...mesonSubdirs, 'meson.build', 'meson_options.txt']) {
      assert.ok(copied.has(d), `${file} does not copy ${d}, which meson needs`);
      assert.ok(fs.existsSync(path.join(repoRoot, d)), `${d} does not exist`);
    }
    assert.match(text, new RegExp(`meson compile -C /build ${exe} `));
    assert.match(text, new RegExp(`install -D -m 0755 /build/${subdir}/${exe} /out/usr/local/bin/${exe}`));
    assert.match(text, /^USER 65532:65532$/m);
    assert.match(text, new RegExp(`^ENTRYPOINT \\["/usr/local/bin/${exe}"\\]$`, 'm'));
    // The runtime stage installs every library the binary links (libc6 is
    // in every Debian image).
    const runtime = text.slice(text.lastIndexOf('FROM '));
    const installed = new Set(/apt-get install -y --no-install-recommends ([^\\\n]+)/.exec(runtime)[1].trim().split(/\s+/));
    const binary = path.join(buildDir, subdir, exe);
    for (const [lib, pkg] of packagesOf(binary)) {
      if (pkg === 'libc6') continue;
      assert.ok(installed.has(pkg), `${file}: ${exe} links ${lib} from ${pkg}, which the image does not install`);
    }
  });
}

before(() => {
  assert.ok(fs.existsSync(binPath('thaw-scaler')) && fs.existsSync(binPath('thaw-activator')),
    `build thaw-scaler and thaw-activator in ${buildDir} first`);
});
