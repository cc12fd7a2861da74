// Validates deploy/kubernetes without a cluster or a kustomize binary:
// - a small Kustomize emulator (resources, components, configMapGenerator, patches as strategic
//   merge or JSON 6902, images, namespace) renders the base, the base + operator component, and
//   the production overlay, failing on anything it does not understand;
// - every rendered object is validated against the Kubernetes OpenAPI schemas (kubernetes-models),
//   PodMonitor/PrometheusRule against the Prometheus Operator CRD schemas
//   (@kubernetes-models/prometheus-operator) plus a few checks the schemas leave out, and the
//   PrometheusRule's groups go through `promtool check rules`;
// - deployment invariants (drain vs grace period, probes, security context, ports) are checked by
//   functions that are themselves shown to reject broken manifests.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import YAML from 'yaml';
import { Deployment } from 'kubernetes-models/apps/v1';
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ConfigMap, Namespace, Service } from 'kubernetes-models/v1';
import { PodMonitor, PrometheusRule } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { buildConfig, envOverrides, type Config } from '../../src/config.js';

type Obj = Record<string, any>;

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const k8sDir = join(repo, 'deploy/kubernetes');
const baseDir = join(k8sDir, 'base');
const componentDir = join(k8sDir, 'components/prometheus-operator');
const overlayDir = join(k8sDir, 'overlays/production');
const DEFAULT_DRAIN_SECONDS = 30; // the proxy's default (LLM_PROXY_DRAIN_TIMEOUT / --drain-timeout)

// ---------------------------------------------------------------------------------------------
// Minimal Kustomize emulator. It implements only the fields these manifests use and throws on
// any other kustomization field, so a new feature cannot slip in untested.

const KNOWN_FIELDS = new Set([
  'apiVersion',
  'kind',
  'resources',
  'components',
  'configMapGenerator',
  'patches',
  'images',
  'namespace',
]);
const CLUSTER_SCOPED = new Set(['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'CustomResourceDefinition']);

const clone = <T>(v: T): T => structuredClone(v);
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function parseDocs(file: string): Obj[] {
  const docs = YAML.parseAllDocuments(readFileSync(file, 'utf8'));
  for (const d of docs) if (d.errors.length) throw new Error(`${file}: ${d.errors[0]!.message}`);
  return docs.map((d) => d.toJS()).filter((o) => o != null);
}

function readKustomization(dir: string): Obj {
  const file = join(dir, 'kustomization.yaml');
  if (!existsSync(file)) throw new Error(`no kustomization.yaml in ${dir}`);
  const k = YAML.parse(readFileSync(file, 'utf8')) as Obj;
  for (const key of Object.keys(k)) {
    if (!KNOWN_FIELDS.has(key)) throw new Error(`${file}: field "${key}" is not handled by the test's emulator`);
  }
  return k;
}

function groupVersion(apiVersion: string): { group: string; version: string } {
  const i = apiVersion.indexOf('/');
  return i < 0 ? { group: '', version: apiVersion } : { group: apiVersion.slice(0, i), version: apiVersion.slice(i + 1) };
}

function matchesTarget(o: Obj, t: Obj): boolean {
  const { group, version } = groupVersion(o.apiVersion ?? '');
  const anchored = (re: string, v: string | undefined) => new RegExp(`^(?:${re})$`).test(v ?? '');
  if (t.group !== undefined && t.group !== group) return false;
  if (t.version !== undefined && t.version !== version) return false;
  if (t.kind !== undefined && t.kind !== o.kind) return false;
  if (t.name !== undefined && !anchored(t.name, o.metadata?.name)) return false;
  if (t.namespace !== undefined && !anchored(t.namespace, o.metadata?.namespace)) return false;
  if (t.labelSelector !== undefined) {
    for (const term of String(t.labelSelector).split(',')) {
      const [k, v] = term.split('=').map((s) => s.trim());
      if (o.metadata?.labels?.[k!] !== v) return false;
    }
  }
  return true;
}

// Strategic merge: maps merge, `null` deletes, lists with a known merge key merge by that key,
// other lists are replaced (as for the Kubernetes core types these manifests use).
const MERGE_KEYS: Record<string, string> = {
  containers: 'name',
  initContainers: 'name',
  env: 'name',
  volumes: 'name',
  volumeMounts: 'name',
  ports: 'containerPort',
};
function strategicMerge(target: Obj, patch: Obj): void {
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete target[key];
    else if (isObj(value) && isObj(target[key])) strategicMerge(target[key], value);
    else if (Array.isArray(value) && Array.isArray(target[key]) && MERGE_KEYS[key]) {
      const mk = MERGE_KEYS[key]!;
      for (const item of value) {
        const existing = (target[key] as Obj[]).find((x) => x[mk] === item[mk]);
        if (existing) strategicMerge(existing, item);
        else (target[key] as Obj[]).push(clone(item));
      }
    } else target[key] = clone(value);
  }
}

function jsonPatch(target: Obj, ops: Obj[]): void {
  for (const op of ops) {
    const parts = String(op.path)
      .split('/')
      .slice(1)
      .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
    const last = parts.pop()!;
    let parent: any = target;
    for (const p of parts) {
      if (parent[p] === undefined) throw new Error(`json patch ${op.op} ${op.path}: missing parent "${p}"`);
      parent = parent[p];
    }
    if (op.op === 'add' || op.op === 'replace') {
      if (op.op === 'replace' && !(last in parent)) throw new Error(`json patch replace ${op.path}: no such path`);
      if (Array.isArray(parent)) {
        if (last === '-') parent.push(clone(op.value));
        else parent.splice(Number(last), op.op === 'add' ? 0 : 1, clone(op.value));
      } else parent[last] = clone(op.value);
    } else if (op.op === 'remove') {
      if (!(last in parent)) throw new Error(`json patch remove ${op.path}: no such path`);
      if (Array.isArray(parent)) parent.splice(Number(last), 1);
      else delete parent[last];
    } else throw new Error(`json patch op ${op.op} not handled by the emulator`);
  }
}

interface Patch {
  source: string;
  target: Obj;
  kind: 'strategic' | 'json6902';
  body: any;
}

function loadPatch(dir: string, p: Obj): Patch {
  const source = p.path ? join(dir, p.path) : `${dir}/kustomization.yaml (inline)`;
  const body = YAML.parse(p.path ? readFileSync(join(dir, p.path), 'utf8') : p.patch);
  const kind = Array.isArray(body) ? 'json6902' : 'strategic';
  let target: Obj | undefined = p.target;
  if (!target && kind === 'strategic') target = { kind: body.kind, name: body.metadata?.name };
  if (!target) throw new Error(`${source}: a JSON 6902 patch needs a target`);
  return { source, target, kind, body };
}

function applyPatches(objs: Obj[], dir: string, patches: Obj[] | undefined, log: string[]): void {
  for (const p of patches ?? []) {
    const patch = loadPatch(dir, p);
    const hits = objs.filter((o) => matchesTarget(o, patch.target));
    if (hits.length === 0) throw new Error(`${patch.source}: patch target ${JSON.stringify(patch.target)} matches no resource`);
    for (const o of hits) {
      if (patch.kind === 'strategic') {
        if (patch.body.kind !== o.kind) throw new Error(`${patch.source}: patch kind ${patch.body.kind} applied to ${o.kind}`);
        const { apiVersion: _a, kind: _k, metadata, ...rest } = patch.body;
        const { name: _n, ...metaRest } = metadata ?? {};
        strategicMerge(o, Object.keys(metaRest).length ? { ...rest, metadata: metaRest } : rest);
      } else jsonPatch(o, patch.body);
      log.push(`${relative(k8sDir, patch.source)} -> ${o.kind}/${o.metadata.name}`);
    }
  }
}

function applyGenerators(objs: Obj[], dir: string, gens: Obj[] | undefined): void {
  for (const g of gens ?? []) {
    const data: Record<string, string> = {};
    for (const f of g.files ?? []) {
      const [key, path] = String(f).includes('=') ? String(f).split('=') : [basename(String(f)), String(f)];
      data[key!] = readFileSync(join(dir, path!), 'utf8');
    }
    for (const lit of g.literals ?? []) {
      const i = String(lit).indexOf('=');
      data[String(lit).slice(0, i)] = String(lit).slice(i + 1);
    }
    const behavior = g.behavior ?? 'create';
    const existing = objs.find((o) => o.kind === 'ConfigMap' && o.metadata?.name === g.name);
    if (behavior === 'create') {
      if (existing) throw new Error(`configMapGenerator ${g.name}: already exists (use behavior: replace or merge)`);
      objs.push({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: g.name, annotations: { 'test/generated': 'true' } }, data });
    } else {
      if (!existing) throw new Error(`configMapGenerator ${g.name}: behavior ${behavior} but nothing to ${behavior}`);
      existing.data = behavior === 'replace' ? data : { ...existing.data, ...data };
    }
  }
}

function applyImages(objs: Obj[], images: Obj[] | undefined, log: string[]): void {
  for (const img of images ?? []) {
    let hit = false;
    for (const o of objs) {
      for (const c of [...(o.spec?.template?.spec?.containers ?? []), ...(o.spec?.template?.spec?.initContainers ?? [])]) {
        const name = String(c.image).replace(/@.*$/, '').replace(/:[^/:]*$/, '');
        if (name !== img.name) continue;
        const tag = img.digest ? `@${img.digest}` : img.newTag ? `:${img.newTag}` : (String(c.image).match(/([:@][^/]*)$/)?.[1] ?? '');
        c.image = (img.newName ?? name) + tag;
        hit = true;
      }
    }
    if (!hit) throw new Error(`images: ${img.name} matches no container image`);
    log.push(`image ${img.name}`);
  }
}

interface Build {
  objects: Obj[];
  files: Set<string>; // every file the build read
  log: string[];
}

function kustomize(dir: string, acc: Build = { objects: [], files: new Set(), log: [] }, asComponent = false): Build {
  const k = readKustomization(dir);
  acc.files.add(join(dir, 'kustomization.yaml'));
  const expectedKind = asComponent ? 'Component' : 'Kustomization';
  if (k.kind !== expectedKind) throw new Error(`${dir}: kind ${k.kind}, expected ${expectedKind}`);
  const objs: Obj[] = asComponent ? acc.objects : [];
  for (const r of k.resources ?? []) {
    const p = resolve(dir, r);
    if (!existsSync(p)) throw new Error(`${dir}/kustomization.yaml: resource ${r} does not exist`);
    if (statSync(p).isDirectory()) {
      const sub = kustomize(p, { objects: [], files: acc.files, log: acc.log });
      objs.push(...sub.objects);
    } else {
      acc.files.add(p);
      objs.push(...parseDocs(p));
    }
  }
  for (const c of k.components ?? []) {
    const p = resolve(dir, c);
    if (!existsSync(p)) throw new Error(`${dir}/kustomization.yaml: component ${c} does not exist`);
    kustomize(p, { objects: objs, files: acc.files, log: acc.log }, true);
  }
  for (const g of k.configMapGenerator ?? []) for (const f of g.files ?? []) acc.files.add(join(dir, String(f).split('=').pop()!));
  applyGenerators(objs, dir, k.configMapGenerator);
  for (const p of k.patches ?? []) if (p.path) acc.files.add(join(dir, p.path));
  applyPatches(objs, dir, k.patches, acc.log);
  applyImages(objs, k.images, acc.log);
  if (k.namespace) for (const o of objs) if (!CLUSTER_SCOPED.has(o.kind)) o.metadata.namespace = k.namespace;
  const ids = new Set<string>();
  for (const o of objs) {
    const id = `${o.apiVersion}/${o.kind}/${o.metadata?.namespace ?? ''}/${o.metadata?.name}`;
    if (ids.has(id)) throw new Error(`duplicate resource ${id}`);
    ids.add(id);
  }
  if (!asComponent) acc.objects = objs;
  return acc;
}

/** Base rendered with the operator component, as an overlay would include it. */
function baseWithComponent(): Build {
  const b = kustomize(baseDir);
  kustomize(componentDir, b, true);
  return b;
}

// ---------------------------------------------------------------------------------------------
// Schema validation

function validateObject(o: Obj): string[] {
  const id = `${o.kind}/${o.metadata?.name}`;
  const run = (f: () => void) => {
    try {
      f();
      return [];
    } catch (e) {
      return [`${id}: ${(e as Error).message}`];
    }
  };
  switch (`${o.apiVersion} ${o.kind}`) {
    case 'apps/v1 Deployment':
      return run(() => new Deployment(o as any).validate());
    case 'v1 Service':
      return run(() => new Service(o as any).validate());
    case 'v1 ConfigMap':
      return run(() => new ConfigMap(o as any).validate());
    case 'v1 Namespace':
      return run(() => new Namespace(o as any).validate());
    case 'policy/v1 PodDisruptionBudget':
      return run(() => new PodDisruptionBudget(o as any).validate());
    case 'autoscaling/v2 HorizontalPodAutoscaler':
      return run(() => new HorizontalPodAutoscaler(o as any).validate());
    case 'monitoring.coreos.com/v1 PodMonitor':
      return [...run(() => new PodMonitor(o as any).validate()), ...checkPodMonitor(o)];
    case 'monitoring.coreos.com/v1 PrometheusRule':
      return [...run(() => new PrometheusRule(o as any).validate()), ...checkPrometheusRule(o)];
    default:
      return [`${id}: no validator for ${o.apiVersion} ${o.kind}`];
  }
}

// What the Prometheus Operator CRD schemas do not say but the operator or Prometheus needs
// (a selector and endpoints to scrape; one of record/alert; unique group names).
function checkPodMonitor(o: Obj): string[] {
  const errs: string[] = [];
  if (typeof o.metadata?.name !== 'string') errs.push('PodMonitor: metadata.name required');
  if (!isObj(o.spec)) return [...errs, 'PodMonitor: spec required'];
  if (!isObj(o.spec.selector)) errs.push('PodMonitor: spec.selector required');
  if (!Array.isArray(o.spec.podMetricsEndpoints) || o.spec.podMetricsEndpoints.length === 0) errs.push('PodMonitor: spec.podMetricsEndpoints required');
  for (const ep of o.spec.podMetricsEndpoints ?? []) {
    if (typeof ep.port !== 'string' && ep.portNumber === undefined) errs.push('PodMonitor endpoint: port (name) or portNumber required');
    for (const d of ['interval', 'scrapeTimeout']) {
      if (ep[d] !== undefined && !/^(\d+(ms|s|m|h))+$/.test(ep[d])) errs.push(`PodMonitor endpoint: bad ${d} ${ep[d]}`);
    }
  }
  return errs;
}

function checkPrometheusRule(o: Obj): string[] {
  const errs: string[] = [];
  if (typeof o.metadata?.name !== 'string') errs.push('PrometheusRule: metadata.name required');
  const groups = o.spec?.groups;
  if (!Array.isArray(groups)) return [...errs, 'PrometheusRule: spec.groups must be a list'];
  const names = new Set<string>();
  for (const g of groups) {
    if (typeof g.name !== 'string' || g.name === '') errs.push('PrometheusRule: group without name');
    if (names.has(g.name)) errs.push(`PrometheusRule: duplicate group ${g.name}`);
    names.add(g.name);
    for (const r of g.rules ?? []) {
      if ((r.record === undefined) === (r.alert === undefined)) errs.push(`group ${g.name}: a rule needs exactly one of record/alert`);
      if (typeof r.expr !== 'string' && typeof r.expr !== 'number') errs.push(`group ${g.name}: rule without expr`);
      // The schemas of @kubernetes-models/prometheus-operator 4.x predate keep_firing_for (CRD v0.66):
      // an unknown field to them, so its value is checked here (Prometheus's duration pattern).
      for (const d of ['for', 'keep_firing_for']) {
        if (r[d] !== undefined && !/^(?=\d)(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$/.test(r[d])) errs.push(`group ${g.name}: ${r.alert ?? r.record}: bad ${d} ${r[d]}`);
      }
    }
  }
  return errs;
}

// ---------------------------------------------------------------------------------------------
// Invariants

function durationSeconds(s: string): number {
  const m = /^(\d+)(s|m)?$/.exec(s.trim());
  if (!m) throw new Error(`cannot parse duration ${s}`);
  return Number(m[1]) * (m[2] === 'm' ? 60 : 1);
}

/** A number of seconds the container sets by flag (which wins) or variable, else the proxy's default. */
function secondsSetting(c: Obj, flag: string, variable: string, byDefault: number): number {
  const args: string[] = c.args ?? [];
  const i = args.findIndex((a) => a === `--${flag}` || a.startsWith(`--${flag}=`));
  if (i >= 0) return Number(args[i]!.includes('=') ? args[i]!.split('=')[1] : args[i + 1]);
  // The last entry wins in Kubernetes.
  const env = (c.env ?? []).findLast((e: Obj) => e.name === variable);
  return env ? Number(env.value) : byDefault;
}
const drainSeconds = (c: Obj) => secondsSetting(c, 'drain-timeout', 'LLM_PROXY_DRAIN_TIMEOUT', DEFAULT_DRAIN_SECONDS);
const finalScrapeSeconds = (c: Obj) => secondsSetting(c, 'final-scrape-wait', 'LLM_PROXY_FINAL_SCRAPE_WAIT', 0);

/**
 * Seconds the process may still need after the drain deadline: the last OTLP push (the proxy
 * waits for it at most SHUTDOWN_PUSH_MS, 5 s, shorter than the exporter's own 10 s request
 * timeout) and the log flush (exitAfterLogs waits at most 2 s), with 5 s to spare (WebSocket
 * tunnels open at the deadline take up to 3 s of it: a frame in flight, then 2 s for the peers).
 */
const EXIT_MARGIN = 12;

function preStopSeconds(c: Obj): number {
  const h = c.lifecycle?.preStop;
  if (!h) return 0;
  if (h.sleep) return Number(h.sleep.seconds);
  const cmd: string[] = h.exec?.command ?? [];
  if (cmd[0] === 'sleep' || cmd[0] === '/bin/sleep') return durationSeconds(cmd[1]!);
  throw new Error(`cannot tell how long preStop ${JSON.stringify(h)} takes`);
}

function containerPort(c: Obj, port: string | number): number | undefined {
  if (typeof port === 'number') return (c.ports ?? []).some((p: Obj) => p.containerPort === port) ? port : undefined;
  return (c.ports ?? []).find((p: Obj) => p.name === port)?.containerPort;
}

function selects(selector: Obj | undefined, labels: Obj | undefined): boolean {
  const ml = selector?.matchLabels ?? selector ?? {};
  return Object.keys(ml).length > 0 && Object.entries(ml).every(([k, v]) => labels?.[k] === v);
}

const byKind = (objs: Obj[], kind: string) => objs.filter((o) => o.kind === kind);

function checkInvariants(objs: Obj[]): string[] {
  const errs: string[] = [];
  const deps = byKind(objs, 'Deployment');
  if (deps.length !== 1) return [`expected 1 Deployment, got ${deps.length}`];
  const d = deps[0]!;
  const pod = d.spec.template.spec;
  const podLabels = d.spec.template.metadata?.labels;
  const c = (pod.containers as Obj[]).find((x) => x.name === 'proxy');
  if (!c) return ['no container named proxy'];
  // A Service named llm-proxy in the namespace would otherwise set LLM_PROXY_PORT=tcp://...
  if (pod.enableServiceLinks !== false) errs.push('enableServiceLinks not false: service links can set LLM_PROXY_* variables');

  // Termination: grace period must cover the preStop sleep, the drain and what the process does
  // after it (EXIT_MARGIN).
  const grace = pod.terminationGracePeriodSeconds ?? 30;
  const drain = drainSeconds(c);
  const preStop = preStopSeconds(c);
  if (preStop <= 0) errs.push('no preStop delay: endpoints may still route to a draining pod');
  // After the drain the metrics port may wait for one more scrape (LLM_PROXY_FINAL_SCRAPE_WAIT).
  const finalScrape = finalScrapeSeconds(c);
  const sum = `drain ${drain} + preStop ${preStop}${finalScrape > 0 ? ` + final scrape wait ${finalScrape}` : ''} + ${EXIT_MARGIN}`;
  if (!(grace >= drain + preStop + finalScrape + EXIT_MARGIN)) errs.push(`terminationGracePeriodSeconds ${grace} < ${sum}`);

  // Ports and probes.
  const http = containerPort(c, 'http');
  const metrics = containerPort(c, 'metrics');
  if (http !== 8080) errs.push(`http containerPort ${http}, expected 8080`);
  if (metrics !== 9464) errs.push(`metrics containerPort ${metrics}, expected 9464`);
  const probe = (name: string, path: string) => {
    const p = c[name]?.httpGet;
    if (!p) return errs.push(`${name} missing (httpGet)`);
    if (p.path !== path) errs.push(`${name} path ${p.path}, expected ${path}`);
    if (containerPort(c, p.port) !== metrics) errs.push(`${name} port ${p.port} is not the metrics port`);
  };
  probe('livenessProbe', '/healthz');
  probe('readinessProbe', '/readyz');
  if (c.startupProbe) probe('startupProbe', '/healthz');

  // Listening on all interfaces inside the pod.
  const env = Object.fromEntries((c.env ?? []).map((e: Obj) => [e.name, e.value]));
  if (env.LLM_PROXY_HOST !== undefined && env.LLM_PROXY_HOST !== '0.0.0.0') errs.push('LLM_PROXY_HOST must be 0.0.0.0');
  if (env.LLM_PROXY_METRICS_HOST !== undefined && env.LLM_PROXY_METRICS_HOST !== '0.0.0.0') errs.push('LLM_PROXY_METRICS_HOST must be 0.0.0.0');

  // Security context.
  const psc = pod.securityContext ?? {};
  const csc = c.securityContext ?? {};
  if (!(psc.runAsNonRoot === true || csc.runAsNonRoot === true)) errs.push('runAsNonRoot not set');
  if ((csc.runAsUser ?? psc.runAsUser) === 0) errs.push('runs as uid 0');
  if (csc.readOnlyRootFilesystem !== true) errs.push('readOnlyRootFilesystem not true');
  if (csc.allowPrivilegeEscalation !== false) errs.push('allowPrivilegeEscalation not false');
  if (!(csc.capabilities?.drop ?? []).includes('ALL')) errs.push('capabilities do not drop ALL');
  if ((csc.capabilities?.add ?? []).length) errs.push('capabilities added');
  if ((csc.seccompProfile ?? psc.seccompProfile)?.type !== 'RuntimeDefault') errs.push('seccompProfile not RuntimeDefault');
  if (!c.resources?.requests?.cpu || !c.resources?.requests?.memory || !c.resources?.limits?.memory) errs.push('resources incomplete');

  // Config: mounted ConfigMap with config.yaml, passed with --config, ports consistent.
  const args: string[] = c.args ?? [];
  const cfgPath = args[args.indexOf('--config') + 1];
  if (args.indexOf('--config') < 0 || cfgPath !== '/etc/llm-latency-proxy/config.yaml') errs.push(`--config ${cfgPath}`);
  const mount = (c.volumeMounts ?? []).find((m: Obj) => cfgPath?.startsWith(m.mountPath + '/'));
  const vol = mount && (pod.volumes ?? []).find((v: Obj) => v.name === mount.name);
  const cm = vol?.configMap && objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === vol.configMap.name);
  const key = cfgPath && mount ? cfgPath.slice(mount.mountPath.length + 1) : '';
  if (!cm) errs.push('config volume does not reference a ConfigMap in the build');
  else if (typeof cm.data?.[key] !== 'string') errs.push(`ConfigMap ${cm.metadata.name} has no key ${key}`);
  else {
    const cfg = YAML.parse(cm.data[key]);
    if (!Array.isArray(cfg.routes) || cfg.routes.length === 0) errs.push('config: no routes');
    for (const r of cfg.routes ?? []) {
      if (typeof r.prefix !== 'string' || !r.prefix.startsWith('/')) errs.push(`config route prefix ${r.prefix}`);
      try {
        const u = new URL(r.upstream);
        if (!/^https?:$/.test(u.protocol)) errs.push(`config route upstream ${r.upstream}`);
      } catch {
        errs.push(`config route upstream ${r.upstream} is not a URL`);
      }
    }
    if (cfg.listen?.port !== http) errs.push(`config listen.port ${cfg.listen?.port} != http containerPort ${http}`);
    if (cfg.metrics?.port !== metrics) errs.push(`config metrics.port ${cfg.metrics?.port} != metrics containerPort ${metrics}`);
    if (cfg.listen?.host !== '0.0.0.0' || cfg.metrics?.host !== '0.0.0.0') errs.push('config hosts must be 0.0.0.0');
  }

  // Annotations for annotation-based scraping.
  const ann = d.spec.template.metadata?.annotations ?? {};
  if (ann['prometheus.io/scrape'] !== 'true') errs.push('prometheus.io/scrape annotation');
  if (Number(ann['prometheus.io/port']) !== metrics) errs.push('prometheus.io/port is not the metrics port');
  if (ann['prometheus.io/path'] !== '/metrics') errs.push('prometheus.io/path annotation');

  // Service: selects the pods, target ports exist on the container.
  const svcs = byKind(objs, 'Service');
  if (svcs.length !== 1) errs.push(`expected 1 Service, got ${svcs.length}`);
  for (const s of svcs) {
    if (!selects(s.spec.selector, podLabels)) errs.push(`Service ${s.metadata.name} does not select the pods`);
    for (const p of s.spec.ports) {
      const target = containerPort(c, p.targetPort ?? p.port);
      if (target === undefined) errs.push(`Service port ${p.name} targets ${p.targetPort}, not a container port`);
    }
    for (const need of ['http', 'metrics']) {
      const p = s.spec.ports.find((x: Obj) => x.name === need);
      if (!p || containerPort(c, p.targetPort) !== containerPort(c, need)) errs.push(`Service has no ${need} port to the container's ${need} port`);
    }
  }

  // PDB, HPA.
  for (const p of byKind(objs, 'PodDisruptionBudget')) if (!selects(p.spec.selector, podLabels)) errs.push('PDB does not select the pods');
  const hpas = byKind(objs, 'HorizontalPodAutoscaler');
  if (hpas.length !== 1) errs.push(`expected 1 HPA, got ${hpas.length}`);
  for (const h of hpas) {
    const ref = h.spec.scaleTargetRef;
    if (ref.kind !== 'Deployment' || ref.name !== d.metadata.name || ref.apiVersion !== 'apps/v1') errs.push('HPA does not target the Deployment');
    if (!(h.spec.minReplicas >= 2)) errs.push('HPA minReplicas < 2: the PDB would block every drain');
    if (!(h.spec.maxReplicas >= h.spec.minReplicas)) errs.push('HPA maxReplicas < minReplicas');
    if (d.spec.replicas !== undefined) errs.push('Deployment sets replicas while an HPA owns it');
  }

  // PodMonitor (when the component is in): selects the pods, scrapes the container's metrics
  // port by name, names the job after a label the pods carry.
  for (const pm of byKind(objs, 'PodMonitor')) {
    if (!selects(pm.spec.selector, podLabels)) errs.push('PodMonitor does not select the pods');
    // Without it the job is <namespace>/<PodMonitor name>, not the llm-latency-proxy it was.
    if (pm.spec.jobLabel === undefined || podLabels?.[pm.spec.jobLabel] !== 'llm-latency-proxy') errs.push(`PodMonitor jobLabel ${pm.spec.jobLabel} does not name the job llm-latency-proxy`);
    for (const ep of pm.spec.podMetricsEndpoints ?? []) {
      const port = (c?.ports ?? []).find((p: Obj) => p.name === ep.port);
      if (port === undefined) errs.push(`PodMonitor port ${ep.port} not on the container`);
      else if (port.containerPort !== metrics) errs.push(`PodMonitor port ${ep.port} is not the metrics port`);
      if ((ep.path ?? '/metrics') !== '/metrics') errs.push('PodMonitor path');
      // The streams that end during the drain reach Prometheus only if a scrape begun after it
      // is sent within the final scrape wait: one interval, then up to the scrape timeout.
      const interval = durationSeconds(ep.interval ?? '30s');
      const timeout = durationSeconds(ep.scrapeTimeout ?? '10s');
      if (!(finalScrape >= interval + timeout)) errs.push(`final scrape wait ${finalScrape} s < PodMonitor interval ${interval} s + scrapeTimeout ${timeout} s: the streams that end during the drain may never be scraped`);
    }
  }

  // Namespaces consistent.
  const nss = new Set(objs.filter((o) => !CLUSTER_SCOPED.has(o.kind)).map((o) => o.metadata.namespace ?? ''));
  if (nss.size > 1) errs.push(`objects in several namespaces: ${[...nss].join(', ')}`);
  return errs;
}

// ---------------------------------------------------------------------------------------------
// The configuration the proxy would actually run with in the pod: the image's ENV (from
// deploy/Dockerfile's final stage), then the container's env, then its flags, over the mounted
// config file, through the proxy's own config loader (src/config.ts).

function imageEnv(): Record<string, string> {
  const text = readFileSync(join(repo, 'deploy/Dockerfile'), 'utf8').replace(/\\\n/g, ' ');
  const stages = text.split(/^FROM\s/m);
  const env: Record<string, string> = {};
  for (const line of stages.at(-1)!.split('\n')) {
    const m = /^ENV\s+(.*)$/.exec(line.trim());
    if (!m) continue;
    for (const kv of m[1]!.trim().split(/\s+/)) {
      const i = kv.indexOf('=');
      if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
    }
  }
  return env;
}

function effectiveConfig(objs: Obj[]): Config {
  const d = byKind(objs, 'Deployment')[0]!;
  const pod = d.spec.template.spec;
  const c = (pod.containers as Obj[]).find((x) => x.name === 'proxy')!;
  const env = { ...imageEnv(), ...Object.fromEntries((c.env ?? []).map((e: Obj) => [e.name, String(e.value)])) };
  const args: string[] = c.args ?? [];
  const flag = (name: string) => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const cfgPath = flag('config') ?? env.LLM_PROXY_CONFIG;
  let raw: unknown = {};
  if (cfgPath) {
    const mount = (c.volumeMounts ?? []).find((m: Obj) => cfgPath.startsWith(m.mountPath + '/'));
    const vol = (pod.volumes ?? []).find((v: Obj) => v.name === mount?.name);
    const cm = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === vol?.configMap?.name);
    const text = cm?.data?.[cfgPath.slice(mount.mountPath.length + 1)];
    if (typeof text !== 'string') throw new Error(`--config ${cfgPath} is not in a mounted ConfigMap`);
    raw = YAML.parse(text);
  }
  const flags = Object.fromEntries(
    Object.entries({
      upstream: flag('upstream'),
      host: flag('host'),
      port: flag('port') === undefined ? undefined : Number(flag('port')),
      metricsHost: flag('metrics-host'),
      metricsPort: flag('metrics-port') === undefined ? undefined : Number(flag('metrics-port')),
      drainTimeout: flag('drain-timeout') === undefined ? undefined : Number(flag('drain-timeout')),
      finalScrapeWait: flag('final-scrape-wait') === undefined ? undefined : Number(flag('final-scrape-wait')),
      logLevel: flag('log-level'),
    }).filter(([, v]) => v !== undefined),
  );
  return buildConfig(raw, { ...envOverrides(env), ...flags }, cfgPath ?? 'flags');
}

function checkEffectiveConfig(objs: Obj[]): string[] {
  let cfg: Config;
  try {
    cfg = effectiveConfig(objs);
  } catch (e) {
    return [(e as Error).message];
  }
  const errs: string[] = [];
  const c = byKind(objs, 'Deployment')[0]!.spec.template.spec.containers[0];
  if (cfg.useSimulator) errs.push('no upstream configured: the proxy would serve its built-in simulator');
  if (cfg.host !== '0.0.0.0' || cfg.metrics.host !== '0.0.0.0') errs.push(`listens on ${cfg.host} / ${cfg.metrics.host}, not 0.0.0.0`);
  if (cfg.port !== containerPort(c, 'http')) errs.push(`proxy port ${cfg.port} != http containerPort`);
  if (cfg.metrics.port !== containerPort(c, 'metrics')) errs.push(`metrics port ${cfg.metrics.port} != metrics containerPort`);
  if (!cfg.metrics.enabled) errs.push('metrics disabled');
  const grace = byKind(objs, 'Deployment')[0]!.spec.template.spec.terminationGracePeriodSeconds ?? 30;
  if (!(grace >= cfg.drainTimeout + preStopSeconds(c) + cfg.metrics.finalScrapeWait + EXIT_MARGIN)) {
    errs.push(`drainTimeout ${cfg.drainTimeout} and metrics.finalScrapeWait ${cfg.metrics.finalScrapeWait} do not fit the grace period ${grace}`);
  }
  return errs;
}

// ---------------------------------------------------------------------------------------------

function promtool(): string {
  const r = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  if (r.error) throw new Error('promtool not found on PATH (Debian: apt-get install prometheus); it is needed to check rule groups');
  return 'promtool';
}

function promtoolCheckRules(groups: Obj[]): { status: number; output: string } {
  const dir = mkdtempSync(join(tmpdir(), 'deploy-k8s-rules-'));
  try {
    const file = join(dir, 'rules.yaml');
    writeFileSync(file, YAML.stringify({ groups }, { lineWidth: 0 }));
    const r = spawnSync(promtool(), ['check', 'rules', file], { encoding: 'utf8' });
    return { status: r.status ?? -1, output: `${r.stdout}${r.stderr}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function listFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? listFiles(join(dir, e.name)) : [join(dir, e.name)],
  );
}

describe('deploy/kubernetes: kustomize builds', () => {
  const builds: Record<string, () => Build> = {
    base: () => kustomize(baseDir),
    'base + prometheus-operator component': baseWithComponent,
    'overlays/production': () => kustomize(overlayDir),
  };

  for (const [name, build] of Object.entries(builds)) {
    describe(name, () => {
      it('renders, and every object validates against its schema', () => {
        const { objects } = build();
        expect(objects.length).toBeGreaterThan(0);
        expect(objects.flatMap(validateObject)).toEqual([]);
      });

      it('keeps the deployment invariants', () => {
        expect(checkInvariants(build().objects)).toEqual([]);
      });

      it("the proxy's own config loader accepts what the pod would run with", () => {
        expect(checkEffectiveConfig(build().objects)).toEqual([]);
      });
    });
  }

  // The real kustomize, where it is installed (kubectl carries it): the rendering above must be
  // what `kubectl apply -k` would apply.
  const kubectl = spawnSync('kubectl', ['version', '--client'], { encoding: 'utf8' });
  it.skipIf(kubectl.status !== 0)('agrees with kubectl kustomize on the base and the production overlay', () => {
    const byId = (objs: Obj[]) => Object.fromEntries(objs.map((o) => [`${o.kind}/${o.metadata?.namespace ?? ''}/${o.metadata?.name}`, o]));
    // Differences on purpose: kustomize names a generated ConfigMap with a content hash (and
    // rewrites its references), the emulation marks it generated instead; a strategic merge
    // patch moves the env entries it sets to the front (no entry refers to another: order is moot).
    const unhashed = (text: string) => text.replace(/(llm-latency-proxy-config)-[a-z0-9]{10}\b/g, '$1');
    const normal = (o: Obj): Obj => {
      const c = JSON.parse(JSON.stringify(o)) as Obj;
      if (c.metadata?.annotations) {
        delete c.metadata.annotations['test/generated'];
        if (Object.keys(c.metadata.annotations).length === 0) delete c.metadata.annotations;
      }
      for (const k of c.spec?.template?.spec?.containers ?? []) k.env?.sort((a: Obj, b: Obj) => String(a.name).localeCompare(String(b.name)));
      return c;
    };
    for (const dir of [baseDir, overlayDir]) {
      const real = spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
      expect(real.stderr).toBe('');
      const theirs = byId(YAML.parseAllDocuments(unhashed(real.stdout)).map((d) => normal(d.toJS() as Obj)));
      expect(byId(kustomize(dir).objects.map(normal))).toEqual(theirs);
    }
  });

  it('the base has the expected kinds and no operator CRD objects (applies without the operator)', () => {
    const kinds = kustomize(baseDir).objects.map((o) => o.kind).sort();
    expect(kinds).toEqual(['ConfigMap', 'Deployment', 'HorizontalPodAutoscaler', 'PodDisruptionBudget', 'Service']);
  });

  it('the production overlay changes what an installation sets, without editing the base', () => {
    const { objects, log } = kustomize(overlayDir);
    const d = byKind(objects, 'Deployment')[0]!;
    const c = d.spec.template.spec.containers[0];
    const baseDep = byKind(kustomize(baseDir).objects, 'Deployment')[0]!;
    const baseC = baseDep.spec.template.spec.containers[0];
    // image
    expect(c.image).not.toBe(baseC.image);
    expect(c.image).toMatch(/^[^:]+\/llm-latency-proxy:[\w.-]+$/);
    // resources and HPA range come from patches
    expect(c.resources).not.toEqual(baseC.resources);
    const hpa = byKind(objects, 'HorizontalPodAutoscaler')[0]!;
    expect(hpa.spec.minReplicas).toBeGreaterThanOrEqual(2);
    // routes replaced
    const cm = byKind(objects, 'ConfigMap')[0]!;
    const baseCm = byKind(kustomize(baseDir).objects, 'ConfigMap')[0]!;
    expect(cm.data['config.yaml']).not.toBe(baseCm.data['config.yaml']);
    // every object namespaced, the Namespace included, operator objects labelled for selection
    const ns = byKind(objects, 'Namespace')[0]!;
    for (const o of objects) if (o.kind !== 'Namespace') expect(o.metadata.namespace, `${o.kind}`).toBe(ns.metadata.name);
    for (const o of objects.filter((x) => x.apiVersion.startsWith('monitoring.coreos.com/'))) expect(o.metadata.labels.release).toBeTruthy();
    expect(log.length).toBeGreaterThanOrEqual(4);
  });

  it('every YAML file under deploy/kubernetes is used by some kustomization', () => {
    const used = new Set<string>();
    for (const b of [kustomize(baseDir), baseWithComponent(), kustomize(overlayDir)]) for (const f of b.files) used.add(f);
    const yamlFiles = listFiles(k8sDir).filter((f) => /\.ya?ml$/.test(f));
    expect(yamlFiles.filter((f) => !used.has(f)).map((f) => relative(k8sDir, f))).toEqual([]);
  });
});

describe('deploy/kubernetes: the checks reject broken manifests', () => {
  const good = () => baseWithComponent().objects;
  const mutate = (f: (objs: Obj[]) => void) => {
    const objs = good();
    f(objs);
    return objs;
  };
  const dep = (objs: Obj[]) => byKind(objs, 'Deployment')[0]!;
  const ctr = (objs: Obj[]) => dep(objs).spec.template.spec.containers[0];

  it('grace period shorter than preStop + drain', () => {
    const objs = mutate((o) => (dep(o).spec.template.spec.terminationGracePeriodSeconds = 30));
    expect(checkInvariants(objs).join('\n')).toMatch(/terminationGracePeriodSeconds 30/);
  });
  it('grace period with no room for the last OTLP push and the log flush after the drain', () => {
    // The base had 45 s before the last push's wait was counted: SIGKILL during a hung push.
    const objs = mutate((o) => (dep(o).spec.template.spec.terminationGracePeriodSeconds = 65));
    expect(checkInvariants(objs).join('\n')).toMatch(/terminationGracePeriodSeconds 65 < drain 30 \+ preStop 5 \+ final scrape wait 25 \+ 12/);
  });
  it('a final scrape wait needs a longer grace period, and must outlast the PodMonitor interval and scrape timeout', () => {
    const long = mutate((o) => ctr(o).env.push({ name: 'LLM_PROXY_FINAL_SCRAPE_WAIT', value: '60' }));
    expect(checkInvariants(long).join('\n')).toMatch(/terminationGracePeriodSeconds 75 < drain 30 \+ preStop 5 \+ final scrape wait 60 \+ 12/);
    const off = mutate((o) => ctr(o).args.push('--final-scrape-wait', '0'));
    expect(checkInvariants(off).join('\n')).toMatch(/final scrape wait 0 s < PodMonitor interval 15 s \+ scrapeTimeout 10 s/);
    const slow = mutate((o) => (byKind(o, 'PodMonitor')[0]!.spec.podMetricsEndpoints[0].interval = '1m'));
    expect(checkInvariants(slow).join('\n')).toMatch(/final scrape wait 25 s < PodMonitor interval 60 s/);
    const patient = mutate((o) => (byKind(o, 'PodMonitor')[0]!.spec.podMetricsEndpoints[0].scrapeTimeout = '15s'));
    expect(checkInvariants(patient).join('\n')).toMatch(/final scrape wait 25 s < PodMonitor interval 15 s \+ scrapeTimeout 15 s/);
  });
  it('a longer drain set by flag needs a longer grace period', () => {
    const objs = mutate((o) => ctr(o).args.push('--drain-timeout', '120'));
    expect(checkInvariants(objs).join('\n')).toMatch(/drain 120/);
  });
  it('probes on the wrong path or port', () => {
    const objs = mutate((o) => {
      ctr(o).livenessProbe.httpGet.port = 'http';
      ctr(o).readinessProbe.httpGet.path = '/healthz';
    });
    const errs = checkInvariants(objs).join('\n');
    expect(errs).toMatch(/livenessProbe port http/);
    expect(errs).toMatch(/readinessProbe path \/healthz/);
  });
  it('service links left on', () => {
    expect(checkInvariants(mutate((o) => delete dep(o).spec.template.spec.enableServiceLinks)).join('\n')).toMatch(/enableServiceLinks not false/);
  });
  it('security context weakened', () => {
    const objs = mutate((o) => {
      ctr(o).securityContext.readOnlyRootFilesystem = false;
      ctr(o).securityContext.capabilities.drop = ['NET_RAW'];
    });
    expect(checkInvariants(objs).length).toBeGreaterThanOrEqual(2);
  });
  it('Service port pointing at a port the container does not have', () => {
    const objs = mutate((o) => (byKind(o, 'Service')[0]!.spec.ports[1].targetPort = 9999));
    expect(checkInvariants(objs).join('\n')).toMatch(/targets 9999/);
  });
  it('PodMonitor that misses the pods, scrapes another port or names the job after a label they lack', () => {
    const pm = (o: Obj[]) => byKind(o, 'PodMonitor')[0]!;
    expect(checkInvariants(mutate((o) => (pm(o).spec.selector.matchLabels['app.kubernetes.io/component'] = 'other'))).join('\n')).toMatch(/PodMonitor does not select the pods/);
    expect(checkInvariants(mutate((o) => (pm(o).spec.podMetricsEndpoints[0].port = 'http'))).join('\n')).toMatch(/PodMonitor port http is not the metrics port/);
    expect(checkInvariants(mutate((o) => (pm(o).spec.podMetricsEndpoints[0].port = 'prom'))).join('\n')).toMatch(/PodMonitor port prom not on the container/);
    expect(checkInvariants(mutate((o) => (pm(o).spec.jobLabel = 'app'))).join('\n')).toMatch(/PodMonitor jobLabel app does not name the job/);
    expect(checkInvariants(mutate((o) => delete pm(o).spec.jobLabel)).join('\n')).toMatch(/PodMonitor jobLabel undefined does not name the job/);
    expect(checkInvariants(mutate((o) => (pm(o).spec.jobLabel = 'app.kubernetes.io/component'))).join('\n')).toMatch(/does not name the job/);
    expect(checkInvariants(good())).toEqual([]);
  });
  it('schema violations are caught by kubernetes-models', () => {
    const objs = mutate((o) => (ctr(o).ports[0].containerPort = '8080'));
    expect(objs.flatMap(validateObject).join('\n')).toMatch(/containerPort must be integer/);
    const noContainers = mutate((o) => delete dep(o).spec.template.spec.containers);
    expect(noContainers.flatMap(validateObject).join('\n')).toMatch(/containers/);
  });
  it('Prometheus Operator schema violations are caught by @kubernetes-models/prometheus-operator', () => {
    const render = () => baseWithComponent().objects.map((o) => structuredClone(o));
    const clean = render();
    expect(clean.filter((o) => o.apiVersion === 'monitoring.coreos.com/v1').map((o) => o.kind).sort()).toEqual(['PodMonitor', 'PrometheusRule']);
    expect(clean.flatMap(validateObject)).toEqual([]);
    const badFor = render();
    const rule = badFor.find((o) => o.kind === 'PrometheusRule')!.spec.groups.flatMap((g: Obj) => g.rules).find((r: Obj) => r.for !== undefined);
    rule.for = '5 minutes';
    expect(badFor.flatMap(validateObject).join('\n')).toMatch(/rules\/\d+\/for must match pattern/);
    // keep_firing_for: unknown to the 4.x schemas, checked by checkPrometheusRule
    const badHold = render();
    const held = badHold.find((o) => o.kind === 'PrometheusRule')!.spec.groups.flatMap((g: Obj) => g.rules).find((r: Obj) => r.keep_firing_for !== undefined);
    held.keep_firing_for = '15 minutes';
    expect(badHold.flatMap(validateObject).join('\n')).toMatch(/LLMProxy\w+Regression: bad keep_firing_for 15 minutes/);
    const numericPort = render();
    numericPort.find((o) => o.kind === 'PodMonitor')!.spec.podMetricsEndpoints[0].port = 9464;
    expect(numericPort.flatMap(validateObject).join('\n')).toMatch(/podMetricsEndpoints\/0\/port must be string/);
  });
  it("the image's ENV is read from the Dockerfile (hosts set, ports left to the config)", () => {
    const env = imageEnv();
    expect(env).toMatchObject({ LLM_PROXY_HOST: '0.0.0.0', LLM_PROXY_METRICS_HOST: '0.0.0.0', NODE_ENV: 'production' });
    expect(env.LLM_PROXY_PORT).toBeUndefined();
    // without the Deployment's own env the image alone must still make the pod listen on 0.0.0.0
    const objs = mutate((o) => (ctr(o).env = ctr(o).env.filter((e: Obj) => !/_HOST$/.test(e.name))));
    expect(checkEffectiveConfig(objs)).toEqual([]);
  });

  it("config the proxy would reject, or that leaves it on the simulator or loopback", () => {
    const unknownKey = mutate((o) => {
      const cm = byKind(o, 'ConfigMap')[0]!;
      cm.data['config.yaml'] = cm.data['config.yaml'].replace('routes:', 'routez:');
    });
    expect(checkEffectiveConfig(unknownKey).join('\n')).toMatch(/routez: unknown key/);
    const noRoutes = mutate((o) => {
      const cm = byKind(o, 'ConfigMap')[0]!;
      const cfg = YAML.parse(cm.data['config.yaml']);
      delete cfg.routes;
      cm.data['config.yaml'] = YAML.stringify(cfg);
    });
    expect(checkEffectiveConfig(noRoutes).join('\n')).toMatch(/simulator/);
    const loopback = mutate((o) => ctr(o).env.push({ name: 'LLM_PROXY_METRICS_HOST', value: '127.0.0.1' }));
    // a later duplicate env entry wins in Kubernetes, as in this check
    expect(checkEffectiveConfig(loopback).join('\n')).toMatch(/not 0\.0\.0\.0/);
    const longDrain = mutate((o) => ctr(o).env.push({ name: 'LLM_PROXY_DRAIN_TIMEOUT', value: '600' }));
    expect(checkEffectiveConfig(longDrain).join('\n')).toMatch(/drainTimeout 600/);
  });

  it('a patch whose target does not exist fails the build', () => {
    expect(() => applyPatches(good(), overlayDir, [{ path: 'hpa-patch.yaml', target: { kind: 'HorizontalPodAutoscaler', name: 'nope' } }], [])).toThrow(/matches no resource/);
  });
  it('a PrometheusRule with a duplicate group or a rule without expr', () => {
    const pr = byKind(good(), 'PrometheusRule')[0]!;
    pr.spec.groups = [{ name: 'a', rules: [{ record: 'x' }] }, { name: 'a', rules: [] }];
    const errs = checkPrometheusRule(pr).join('\n');
    expect(errs).toMatch(/duplicate group a/);
    expect(errs).toMatch(/without expr/);
  });
});

describe('deploy/kubernetes: PrometheusRule generated from grafana/alerts', () => {
  const builderPath = join(k8sDir, 'build-prometheusrule.mjs');
  const committedPath = join(componentDir, 'prometheusrule.yaml');
  const load = async () => (await import(builderPath)) as {
    buildPrometheusRule: (dir?: string) => { text: string; groups: Obj[]; files: string[]; skipped: string[] };
    defaultAlertsDir: string;
  };

  it('the committed PrometheusRule is current (else run node deploy/kubernetes/build-prometheusrule.mjs)', async () => {
    const { buildPrometheusRule } = await load();
    expect(readFileSync(committedPath, 'utf8')).toBe(buildPrometheusRule().text);
  });

  it('carries every group of every plain rule file in grafana/alerts, and promtool accepts them', async () => {
    const { buildPrometheusRule, defaultAlertsDir } = await load();
    const built = buildPrometheusRule();
    const pr = parseDocs(committedPath)[0]!;
    expect(checkPrometheusRule(pr)).toEqual([]);
    let expected: Obj[] = [];
    if (existsSync(defaultAlertsDir)) {
      for (const f of readdirSync(defaultAlertsDir).filter((n) => /\.ya?ml$/.test(n)).sort()) {
        const doc = YAML.parse(readFileSync(join(defaultAlertsDir, f), 'utf8'));
        if (Array.isArray(doc?.groups)) expected = expected.concat(doc.groups);
      }
    }
    expect(pr.spec.groups).toEqual(expected);
    expect(built.groups).toEqual(expected);
    const r = promtoolCheckRules(pr.spec.groups);
    expect(r.output).toMatch(/SUCCESS/);
    expect(r.status, r.output).toBe(0);
  });

  it('agrees with any PrometheusRule manifest the grafana/ build ships in grafana/alerts', async () => {
    const { defaultAlertsDir } = await load();
    const pr = parseDocs(committedPath)[0]!;
    const others = existsSync(defaultAlertsDir)
      ? readdirSync(defaultAlertsDir)
          .filter((n) => /\.ya?ml$/.test(n))
          .flatMap((n) => parseDocs(join(defaultAlertsDir, n)))
          .filter((o) => o?.kind === 'PrometheusRule')
      : [];
    for (const o of others) expect(o.spec.groups).toEqual(pr.spec.groups);
  });

  it('the builder merges files in name order, skips non-rule files and rejects duplicate groups', async () => {
    const { buildPrometheusRule } = await load();
    const dir = mkdtempSync(join(tmpdir(), 'deploy-k8s-alerts-'));
    try {
      writeFileSync(join(dir, 'b.rules.yml'), YAML.stringify({ groups: [{ name: 'g2', rules: [{ alert: 'A', expr: 'up == 0', for: '5m' }] }] }));
      writeFileSync(join(dir, 'a.rules.yaml'), YAML.stringify({ groups: [{ name: 'g1', rules: [{ record: 'job:up:sum', expr: 'sum by (job) (up)' }] }] }));
      writeFileSync(join(dir, 'a.test.yaml'), YAML.stringify({ rule_files: ['a.rules.yaml'], tests: [] }));
      writeFileSync(join(dir, 'notes.txt'), 'groups: not yaml rules');
      const out = buildPrometheusRule(dir);
      expect(out.files).toEqual(['a.rules.yaml', 'b.rules.yml']);
      expect(out.skipped).toEqual(['a.test.yaml']);
      const pr = YAML.parse(out.text);
      expect(pr.kind).toBe('PrometheusRule');
      expect(pr.spec.groups.map((g: Obj) => g.name)).toEqual(['g1', 'g2']);
      expect(promtoolCheckRules(pr.spec.groups).status).toBe(0);
      // promtool really checks: a broken expression fails
      expect(promtoolCheckRules([{ name: 'bad', rules: [{ record: 'x', expr: 'sum(' }] }]).status).not.toBe(0);
      writeFileSync(join(dir, 'c.rules.yaml'), YAML.stringify({ groups: [{ name: 'g1', rules: [] }] }));
      expect(() => buildPrometheusRule(dir)).toThrow(/duplicate rule group name "g1"/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the --check mode of the script agrees', () => {
    const out = execFileSync(process.execPath, [builderPath, '--check'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    expect(out).toMatch(/is current/);
  });
});
