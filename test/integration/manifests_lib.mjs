// Helpers for the manifest tests (manifests*.test.mjs, dashboard*.test.mjs):
//
//   - buildKustomization(dir): a small kustomize builder for exactly the
//     kustomization features manifests/ uses (resources: files and
//     directories, namespace, labels, images, configMapGenerator with files
//     and options, patches: strategic-merge patches of maps). Anything else in
//     a kustomization.yaml is an error, not silently ignored. The tests compare
//     its output with `kubectl kustomize` wherever kubectl is installed.
//   - validateObject(obj): validates one object against the JSON schemas of
//     the kubernetes-models packages (Kubernetes, KEDA, prometheus-operator),
//     strictly: a field the schema never looks at is reported as unknown, like
//     kubeconform -strict (the schemas alone accept any extra field).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL, fileURLToPath } from 'node:url';

import YAML from 'yaml';

import { repoRoot } from './lib/harness.mjs';

export const manifestsDir = path.join(repoRoot, 'manifests');

/** Every document of a YAML file, null documents left out. */
export function loadYamlDocs(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
  const out = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${file}: ${d.errors.map((e) => e.message).join('; ')}`);
    const v = d.toJS();
    if (v !== null && v !== undefined) out.push(v);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Kustomize subset

// Kinds that are not namespaced (the namespace transformer leaves them alone).
const CLUSTER_SCOPED = new Set([
  'Namespace', 'ClusterRole', 'ClusterRoleBinding', 'CustomResourceDefinition',
  'PersistentVolume', 'StorageClass', 'PriorityClass', 'IngressClass',
  'MutatingWebhookConfiguration', 'ValidatingWebhookConfiguration', 'APIService',
]);
const KNOWN_KEYS = new Set(['apiVersion', 'kind', 'resources', 'namespace', 'labels', 'images',
  'configMapGenerator', 'patches']);

/** The identity kustomize matches patches and duplicates on. */
export function objectId(o) {
  return `${o.apiVersion}/${o.kind}/${o.metadata?.namespace ?? ''}/${o.metadata?.name}`;
}

function setNamespace(objs, ns) {
  for (const o of objs) {
    if (!CLUSTER_SCOPED.has(o.kind)) o.metadata.namespace = ns;
  }
}

function addLabels(objs, entries, where) {
  for (const e of entries) {
    const extra = Object.keys(e).filter((k) => !['pairs', 'includeSelectors', 'includeTemplates'].includes(k));
    if (extra.length) throw new Error(`${where}: labels: unsupported keys ${extra.join(', ')}`);
    if (e.includeSelectors || e.includeTemplates) {
      throw new Error(`${where}: labels: includeSelectors/includeTemplates are not supported here`);
    }
    for (const o of objs) {
      o.metadata.labels = { ...(o.metadata.labels ?? {}), ...e.pairs };
    }
  }
}

function podSpecs(o) {
  const out = [];
  if (o.spec?.template?.spec) out.push(o.spec.template.spec);           // Deployment, StatefulSet, ...
  if (o.spec?.jobTemplate?.spec?.template?.spec) out.push(o.spec.jobTemplate.spec.template.spec);
  if (o.kind === 'Pod' && o.spec) out.push(o.spec);
  return out;
}

function imageName(image) {
  // name[:tag][@digest]; a registry port contains ':' before the last '/'.
  const at = image.indexOf('@');
  const noDigest = at >= 0 ? image.slice(0, at) : image;
  const slash = noDigest.lastIndexOf('/');
  const colon = noDigest.lastIndexOf(':');
  return colon > slash ? noDigest.slice(0, colon) : noDigest;
}

function setImages(objs, images, where) {
  for (const img of images) {
    const extra = Object.keys(img).filter((k) => !['name', 'newName', 'newTag', 'digest'].includes(k));
    if (extra.length) throw new Error(`${where}: images: unsupported keys ${extra.join(', ')}`);
    for (const o of objs) {
      for (const spec of podSpecs(o)) {
        for (const c of [...(spec.containers ?? []), ...(spec.initContainers ?? [])]) {
          if (imageName(c.image) !== img.name) continue;
          let tagPart = c.image.slice(imageName(c.image).length);
          if (img.newTag !== undefined) tagPart = `:${img.newTag}`;
          if (img.digest !== undefined) tagPart = `@${img.digest}`;
          c.image = (img.newName ?? img.name) + tagPart;
        }
      }
    }
  }
}

function generateConfigMaps(dir, gens, where) {
  const out = [];
  for (const g of gens) {
    const extra = Object.keys(g).filter((k) => !['name', 'files', 'options'].includes(k));
    if (extra.length) throw new Error(`${where}: configMapGenerator: unsupported keys ${extra.join(', ')}`);
    const opts = g.options ?? {};
    const extraOpts = Object.keys(opts).filter((k) => !['disableNameSuffixHash', 'labels', 'annotations'].includes(k));
    if (extraOpts.length) throw new Error(`${where}: configMapGenerator options: unsupported ${extraOpts.join(', ')}`);
    // A name hash would need references rewritten everywhere; not supported.
    if (opts.disableNameSuffixHash !== true) {
      throw new Error(`${where}: configMapGenerator ${g.name}: only disableNameSuffixHash: true is supported`);
    }
    const data = {};
    for (const f of g.files ?? []) {
      if (f.includes('=')) throw new Error(`${where}: configMapGenerator: key=path files are not supported`);
      data[path.basename(f)] = fs.readFileSync(path.join(dir, f), 'utf8');
    }
    const metadata = { name: g.name };
    if (opts.labels) metadata.labels = { ...opts.labels };
    if (opts.annotations) metadata.annotations = { ...opts.annotations };
    out.push({ apiVersion: 'v1', kind: 'ConfigMap', metadata, data });
  }
  return out;
}

// Strategic merge of maps: keys merge recursively, null deletes; a list in a
// patch would need the field's patch strategy, so it is refused.
function mergeMaps(target, patch, where) {
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) {
      delete target[k];
    } else if (Array.isArray(v)) {
      throw new Error(`${where}: list field '${k}' in a patch is not supported by this builder`);
    } else if (typeof v === 'object' && typeof target[k] === 'object' && target[k] !== null && !Array.isArray(target[k])) {
      mergeMaps(target[k], v, where);
    } else {
      target[k] = structuredClone(v);
    }
  }
}

function applyPatches(dir, objs, patches, where) {
  for (const p of patches) {
    const extra = Object.keys(p).filter((k) => k !== 'path');
    if (extra.length) throw new Error(`${where}: patches: only {path} entries are supported (got ${extra.join(', ')})`);
    for (const doc of loadYamlDocs(path.join(dir, p.path))) {
      const id = objectId(doc);
      const t = objs.find((o) => objectId(o) === id);
      if (!t) throw new Error(`${where}: patch ${p.path}: no resource ${id}`);
      mergeMaps(t, doc, `${where}: patch ${p.path}`);
    }
  }
}

/**
 * Builds the kustomization in dir (kustomization.yaml) and returns the list of
 * objects, in resource order. Throws on features it does not implement.
 */
export function buildKustomization(dir) {
  const kfile = path.join(dir, 'kustomization.yaml');
  const where = path.relative(repoRoot, kfile);
  const [k] = loadYamlDocs(kfile);
  const unknown = Object.keys(k).filter((key) => !KNOWN_KEYS.has(key));
  if (unknown.length) throw new Error(`${where}: unsupported kustomization keys: ${unknown.join(', ')}`);
  if (k.apiVersion !== 'kustomize.config.k8s.io/v1beta1' || k.kind !== 'Kustomization') {
    throw new Error(`${where}: not a kustomize.config.k8s.io/v1beta1 Kustomization`);
  }
  let objs = [];
  for (const r of k.resources ?? []) {
    const p = path.join(dir, r);
    if (fs.statSync(p).isDirectory()) objs.push(...buildKustomization(p));
    else objs.push(...loadYamlDocs(p));
  }
  objs.push(...generateConfigMaps(dir, k.configMapGenerator ?? [], where));
  applyPatches(dir, objs, k.patches ?? [], where);
  if (k.namespace) setNamespace(objs, k.namespace);
  addLabels(objs, k.labels ?? [], where);
  setImages(objs, k.images ?? [], where);
  const seen = new Set();
  for (const o of objs) {
    const id = objectId(o);
    if (seen.has(id)) throw new Error(`${where}: duplicate resource ${id}`);
    seen.add(id);
  }
  objs = objs.map((o) => structuredClone(o));
  return objs;
}

// ---------------------------------------------------------------------------
// Schema validation

// apiVersion group -> the package (and folder) holding its models.
const MODEL_PACKAGES = {
  '': 'kubernetes-models/v1',
  apps: 'kubernetes-models/apps',
  autoscaling: 'kubernetes-models/autoscaling',
  policy: 'kubernetes-models/policy',
  batch: 'kubernetes-models/batch',
  'networking.k8s.io': 'kubernetes-models/networking.k8s.io',
  'rbac.authorization.k8s.io': 'kubernetes-models/rbac.authorization.k8s.io',
  'keda.sh': '@kubernetes-models/keda/keda.sh',
  'monitoring.coreos.com': '@kubernetes-models/prometheus-operator/monitoring.coreos.com',
};

const validators = new Map();

/**
 * The compiled JSON-schema validator for apiVersion/kind, taken from the
 * model class's own module (the packages do not export their schema folder).
 */
export async function schemaValidator(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (validators.has(key)) return validators.get(key);
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const pkg = MODEL_PACKAGES[group];
  if (!pkg) throw new Error(`no schema package for apiVersion ${apiVersion}`);
  const spec = group === '' ? `${pkg}/${kind}` : `${pkg}/${version}/${kind}`;
  let modelFile;
  try {
    modelFile = fileURLToPath(import.meta.resolve(spec));
  } catch (e) {
    throw new Error(`no model for ${apiVersion} ${kind} (${spec}): ${e.message}`);
  }
  const src = fs.readFileSync(modelFile, 'utf8');
  const m = /import\{validate\}from"([^"]+_schemas\/[^"]+\.js)"/.exec(src);
  if (!m) throw new Error(`${modelFile}: cannot find its schema import`);
  const mod = await import(pathToFileURL(path.resolve(path.dirname(modelFile), m[1])).href);
  const model = await import(pathToFileURL(modelFile).href);
  const cls = model[kind];
  if (!cls || cls.apiVersion !== apiVersion || cls.kind !== kind) {
    throw new Error(`${spec} is not the model of ${apiVersion} ${kind}`);
  }
  validators.set(key, mod.validate);
  return mod.validate;
}

/**
 * Runs validate over obj through proxies that record which fields the schema
 * reads. Returns {errors: [...strings]}: schema errors, then "unknown field"
 * for every object key the schema never looked up (objects the schema
 * enumerates, i.e. maps such as labels, accept any key).
 */
export function strictValidate(validate, obj) {
  const info = new Map();      // target object -> {path, seen:Set, enumerated}
  const proxies = new WeakMap();
  const wrap = (value, p) => {
    if (value === null || typeof value !== 'object') return value;
    if (proxies.has(value)) return proxies.get(value);
    const meta = { path: p, seen: new Set(), enumerated: Array.isArray(value) };
    info.set(value, meta);
    const proxy = new Proxy(value, {
      get(t, k, r) {
        const v = Reflect.get(t, k, r);
        if (typeof k !== 'string') return v;
        meta.seen.add(k);
        return Object.prototype.hasOwnProperty.call(t, k) ? wrap(v, `${p}/${k}`) : v;
      },
      has(t, k) {
        if (typeof k === 'string') meta.seen.add(k);
        return Reflect.has(t, k);
      },
      ownKeys(t) {
        meta.enumerated = true;
        return Reflect.ownKeys(t);
      },
    });
    proxies.set(value, proxy);
    return proxy;
  };
  const ok = validate(wrap(obj, ''));
  const errors = [];
  if (!ok) {
    for (const e of validate.errors ?? []) {
      errors.push(`${e.instancePath || '/'} ${e.keyword}: ${JSON.stringify(e.params)}`);
    }
  }
  for (const [target, meta] of info) {
    if (meta.enumerated) continue;
    for (const k of Object.keys(target)) {
      if (!meta.seen.has(k)) errors.push(`${meta.path || '/'}: unknown field "${k}"`);
    }
  }
  return { errors };
}

/** Validates one Kubernetes object; resolves to a list of error strings. */
export async function validateObject(obj) {
  if (!obj || typeof obj.apiVersion !== 'string' || typeof obj.kind !== 'string') {
    return ['object without apiVersion/kind'];
  }
  const validate = await schemaValidator(obj.apiVersion, obj.kind);
  return strictValidate(validate, obj).errors;
}

/** Labels a selector's matchLabels requires, all present in labels. */
export function selects(matchLabels, labels) {
  return Object.entries(matchLabels ?? {}).every(([k, v]) => labels?.[k] === v);
}
