// Validates deploy/compose, deploy/Dockerfile and .dockerignore without a Docker engine:
// - compose.yaml against the Compose Specification JSON schema (vendored in test/fixtures/schemas),
//   plus the wiring between services (simulator <-> proxy, mounts that must exist, pinned images);
// - deploy/compose/prometheus.yml with `promtool check config` in a directory laid out like the
//   container's /etc/prometheus, so the rule_files globs load the project's rule files;
// - the Grafana provisioning files against the mounts and the dashboard's datasource references;
// - the Dockerfile's required properties, and its HEALTHCHECK command run against a local server;
// - deploy/compose/loadgen.mjs against a local SSE server, bounded in requests and time.
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, posix, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv, type ErrorObject } from 'ajv';
import addFormatsModule from 'ajv-formats';
import { afterEach, describe, expect, it } from 'vitest';
import YAML from 'yaml';

type Obj = Record<string, any>;

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const composeDir = join(repo, 'deploy/compose');
const composeFile = join(composeDir, 'compose.yaml');
const DRAIN_SECONDS = 30;

const readYaml = (file: string) => YAML.parse(readFileSync(file, 'utf8'), { merge: true }) as Obj;
const compose = () => readYaml(composeFile);

// ---------------------------------------------------------------------------------------------
// Compose Specification schema

function composeValidator() {
  const schema = JSON.parse(readFileSync(join(repo, 'test/fixtures/schemas/compose-spec.json'), 'utf8'));
  // The schema declares "https://json-schema.org/draft-07/schema" (no trailing '#'), which Ajv does
  // not know as a meta-schema id; it is draft-07, Ajv's default dialect. `deprecated` is an
  // annotation keyword unknown to draft-07, hence strict: false.
  delete schema.$schema;
  const ajv = new Ajv({ allErrors: true, strict: false });
  // ajv-formats is CommonJS: under NodeNext its default export is the module object.
  const addFormats = ((addFormatsModule as any).default ?? addFormatsModule) as (a: Ajv) => Ajv;
  addFormats(ajv);
  return ajv.compile(schema);
}

const validateCompose = composeValidator();
function composeErrors(doc: unknown): string[] {
  return validateCompose(doc) ? [] : (validateCompose.errors ?? []).map((e: ErrorObject) => `${e.instancePath} ${e.message}`);
}

/** `${VAR:-default}` -> default; `${VAR}` -> '' (what Compose does with VAR unset). */
function interpolateDefaults(s: string): string {
  return s.replace(/\$\{(\w+)(?::?-([^}]*))?\}/g, (_m, _v, d) => d ?? '');
}

function envOf(service: Obj): Record<string, string> {
  const e = service.environment ?? {};
  if (Array.isArray(e)) return Object.fromEntries(e.map((kv: string) => [kv.split('=')[0], kv.slice(kv.indexOf('=') + 1)]));
  return Object.fromEntries(Object.entries(e).map(([k, v]) => [k, String(v)]));
}

interface Mount {
  source: string;
  target: string;
  readOnly: boolean;
}
function bindMounts(service: Obj): Mount[] {
  return (service.volumes ?? [])
    .map((v: string | Obj) => {
      if (typeof v !== 'string') return v.type === 'bind' ? { source: v.source, target: v.target, readOnly: !!v.read_only } : null;
      const [source, target, mode] = v.split(':');
      return source!.startsWith('.') || source!.startsWith('/') ? { source: source!, target: target!, readOnly: mode === 'ro' } : null;
    })
    .filter(Boolean) as Mount[];
}

function imageTagProblems(image: string): string | null {
  const m = /^(?<name>[^@]+?)(?::(?<tag>[\w][\w.-]*))?(?:@sha256:[0-9a-f]{64})?$/.exec(image);
  if (!m) return `unparseable image ${image}`;
  const tag = m.groups!.tag;
  if (/@sha256:/.test(image)) return null;
  if (!tag) return `${image} has no tag`;
  if (tag === 'latest') return `${image} uses latest`;
  if (!/\d+\.\d+/.test(tag)) return `${image} is not pinned to a version (${tag})`;
  return null;
}

describe('deploy/compose/compose.yaml', () => {
  it('is valid against the Compose Specification schema', () => {
    expect(composeErrors(compose())).toEqual([]);
  });

  it('the schema check rejects invalid files (so the check above means something)', () => {
    const bad1 = compose();
    bad1.services.proxy.ports = { http: 8080 };
    expect(composeErrors(bad1).length).toBeGreaterThan(0);
    const bad2 = compose();
    bad2.services.proxy.restart_policy = 'always'; // not a service-level key
    expect(composeErrors(bad2).join('\n')).toMatch(/additional properties/);
    const bad3 = compose();
    bad3.services.loadgen.depends_on = { proxy: { condition: 'service_ready' } };
    expect(composeErrors(bad3).length).toBeGreaterThan(0);
  });

  it('has the five services, the proxy pointed at the simulator by default', () => {
    const c = compose();
    expect(Object.keys(c.services).sort()).toEqual(['grafana', 'loadgen', 'prometheus', 'proxy', 'simulator']);
    const sim = c.services.simulator;
    const cmd: string[] = sim.command;
    expect(cmd.slice(0, 1)).toEqual(['simulate']);
    expect(cmd[cmd.indexOf('--host') + 1]).toBe('0.0.0.0');
    const simPort = Number(cmd[cmd.indexOf('--port') + 1]);
    const upstreamRaw = envOf(c.services.proxy).LLM_PROXY_UPSTREAM!;
    expect(upstreamRaw).toMatch(/^\$\{LLM_PROXY_UPSTREAM:-/); // one variable switches to a real provider
    const upstream = new URL(interpolateDefaults(upstreamRaw));
    expect(upstream.hostname).toBe('simulator');
    expect(Number(upstream.port)).toBe(simPort);
    // simulator and proxy are the same image, built once (two builds of one tag can fail under
    // Compose's parallel builds) from the repository root with deploy/Dockerfile, by the
    // simulator, which the proxy depends on: `up proxy` and `up simulator` both build it.
    expect(c.services.proxy.image).toBe(sim.image);
    expect(c.services.proxy.build).toBeUndefined();
    expect(Object.keys(c.services.proxy.depends_on)).toContain('simulator');
    expect(resolve(composeDir, sim.build.context)).toBe(repo);
    expect(existsSync(join(repo, sim.build.dockerfile))).toBe(true);
    const built = Object.values<Obj>(c.services).filter((s) => s.build !== undefined);
    expect(new Set(built.map((s) => s.image)).size).toBe(built.length);
    // the image's health check probes the metrics port, which the simulator does not serve
    expect(JSON.stringify(sim.healthcheck.test)).toContain(`:${simPort}/`);
    // the proxy publishes both ports and is given time to drain
    expect(c.services.proxy.ports.map(String)).toEqual(expect.arrayContaining(['127.0.0.1:8080:8080', '127.0.0.1:9464:9464']));
    // A demo stack with an anonymous Grafana: every published port on the host's loopback only.
    for (const svc of Object.values(c.services) as { ports?: unknown[] }[]) for (const p of svc.ports ?? []) expect(String(p)).toMatch(/^127\.0\.0\.1:/);
    // Drain, the final scrape wait, then at most 5 s for the last OTLP push and 2 s for the log flush.
    const env = c.services.proxy.environment as Obj;
    expect(Number(env.LLM_PROXY_DRAIN_TIMEOUT)).toBe(DRAIN_SECONDS);
    const finalScrape = Number(env.LLM_PROXY_FINAL_SCRAPE_WAIT ?? 0);
    expect(Number(/^(\d+)s$/.exec(c.services.proxy.stop_grace_period)?.[1])).toBeGreaterThanOrEqual(DRAIN_SECONDS + finalScrape + 7);
    // One scrape begins within an interval of the drain's end, and may take up to its timeout.
    const { global } = readYaml(join(composeDir, 'prometheus.yml'));
    const seconds = (d: string) => Number(/^(\d+)s$/.exec(d)?.[1]);
    expect(finalScrape).toBeGreaterThanOrEqual(seconds(global.scrape_interval) + seconds(global.scrape_timeout));
    // Compose stops in reverse dependency order: Prometheus must outlive the proxy's drain.
    expect(Object.keys(c.services.proxy.depends_on)).toContain('prometheus');
    expect(c.services.prometheus.depends_on).toBeUndefined();
  });

  it('the load generator targets the proxy and knows the simulator URL (stays idle for a real upstream)', () => {
    const c = compose();
    const env = envOf(c.services.loadgen);
    expect(new URL(env.LOADGEN_TARGET!).host).toBe('proxy:8080');
    expect(interpolateDefaults(env.LOADGEN_UPSTREAM!)).toBe(interpolateDefaults(envOf(c.services.proxy).LLM_PROXY_UPSTREAM!));
    expect(env.LOADGEN_SIMULATOR_URL).toBe(interpolateDefaults(envOf(c.services.proxy).LLM_PROXY_UPSTREAM!));
    expect(c.services.loadgen.restart).toBe('on-failure');
  });

  it('every image is pinned to a version (no latest) and every bind mount source exists', () => {
    const c = compose();
    for (const [name, s] of Object.entries<Obj>(c.services)) {
      if (s.image === c.services.proxy.image) continue; // built locally from deploy/Dockerfile
      expect(imageTagProblems(s.image), name).toBeNull();
      for (const m of bindMounts(s)) expect(existsSync(resolve(composeDir, m.source)), `${name}: ${m.source}`).toBe(true);
    }
    expect(imageTagProblems('prom/prometheus:latest')).toMatch(/latest/);
    expect(imageTagProblems('grafana/grafana')).toMatch(/no tag/);
  });
});

// ---------------------------------------------------------------------------------------------
// Prometheus

function requirePromtool(): void {
  const r = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  if (r.error) throw new Error('promtool not found on PATH (Debian: apt-get install prometheus); the Prometheus config cannot be checked');
}

/** Lays out a temp dir like the Prometheus container: prometheus.yml + the rules mount. */
function mirrorPrometheus(extraRuleFiles: Record<string, string> = {}) {
  const c = compose();
  const mounts = bindMounts(c.services.prometheus);
  const cfgMount = mounts.find((m) => m.target === '/etc/prometheus/prometheus.yml');
  if (!cfgMount) throw new Error('prometheus.yml is not mounted at /etc/prometheus/prometheus.yml');
  const dir = mkdtempSync(join(tmpdir(), 'deploy-compose-prom-'));
  const root = join(dir, 'etc/prometheus');
  mkdirSync(root, { recursive: true });
  cpSync(resolve(composeDir, cfgMount.source), join(root, 'prometheus.yml'));
  for (const m of mounts) {
    if (m === cfgMount || !m.target.startsWith('/etc/prometheus/')) continue;
    cpSync(resolve(composeDir, m.source), join(dir, m.target), { recursive: true });
  }
  for (const [rel, text] of Object.entries(extraRuleFiles)) writeFileSync(join(root, rel), text);
  return { dir, root, config: join(root, 'prometheus.yml') };
}

function promtoolCheckConfig(config: string) {
  requirePromtool();
  const r = spawnSync('promtool', ['check', 'config', config], { encoding: 'utf8', cwd: dirname(config) });
  const output = `${r.stdout}${r.stderr}`;
  const found = /(\d+) rule files found/.exec(output);
  return { status: r.status, output, ruleFiles: found ? Number(found[1]) : 0 };
}

describe('deploy/compose/prometheus.yml', () => {
  const cleanup: string[] = [];
  afterEach(() => {
    for (const d of cleanup.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  it('passes promtool check config and loads every plain rule file from grafana/alerts', () => {
    const m = mirrorPrometheus();
    cleanup.push(m.dir);
    const r = promtoolCheckConfig(m.config);
    expect(r.status, r.output).toBe(0);
    const alertsDir = join(repo, 'grafana/alerts');
    const plainRuleFiles = existsSync(alertsDir)
      ? readdirSync(alertsDir).filter((f) => /\.ya?ml$/.test(f) && Array.isArray(readYaml(join(alertsDir, f))?.groups))
      : [];
    expect(r.ruleFiles).toBe(plainRuleFiles.length);
  });

  it('the rule_files globs resolve inside the rules mount, and promtool rejects a broken rule file there', () => {
    const ok = mirrorPrometheus({ 'rules/zz-extra.rules.yml': YAML.stringify({ groups: [{ name: 'extra', rules: [{ record: 'job:up:sum', expr: 'sum by (job) (up)' }] }] }) });
    cleanup.push(ok.dir);
    const base = mirrorPrometheus();
    cleanup.push(base.dir);
    expect(promtoolCheckConfig(ok.config).ruleFiles).toBe(promtoolCheckConfig(base.config).ruleFiles + 1);
    const bad = mirrorPrometheus({ 'rules/zz-bad.rules.yaml': YAML.stringify({ groups: [{ name: 'bad', rules: [{ record: 'x', expr: 'sum(' }] }] }) });
    cleanup.push(bad.dir);
    expect(promtoolCheckConfig(bad.config).status).not.toBe(0);
  });

  it('scrapes the proxy on its metrics port', () => {
    const cfg = readYaml(join(composeDir, 'prometheus.yml'));
    const job = cfg.scrape_configs.find((j: Obj) => j.static_configs?.some((s: Obj) => s.targets.some((t: string) => t.startsWith('proxy:'))));
    expect(job?.static_configs[0].targets).toContain('proxy:9464');
    expect(job.metrics_path ?? '/metrics').toBe('/metrics');
  });
});

// ---------------------------------------------------------------------------------------------
// Grafana provisioning

describe('deploy/compose Grafana provisioning', () => {
  const c = compose();
  const mounts = bindMounts(c.services.grafana);
  const provMount = mounts.find((m) => m.target === '/etc/grafana/provisioning');
  const dashMount = mounts.find((m) => resolve(composeDir, m.source) === join(repo, 'grafana/dashboards'));

  it('mounts the provisioning directory and the repository dashboards read-only', () => {
    expect(provMount?.readOnly).toBe(true);
    expect(dashMount?.readOnly).toBe(true);
  });

  it('the datasource points at the Prometheus service and the dashboard provider at the mounted dashboards', () => {
    const provDir = resolve(composeDir, provMount!.source);
    const ds = readYaml(join(provDir, 'datasources/prometheus.yaml'));
    expect(ds.apiVersion).toBe(1);
    const prom = ds.datasources.find((d: Obj) => d.type === 'prometheus');
    const url = new URL(prom.url);
    expect(url.hostname).toBe('prometheus');
    expect(c.services.prometheus.ports.map(String).some((p: string) => p.endsWith(`:${url.port}`))).toBe(true);
    expect(prom.isDefault).toBe(true);

    const providers = readdirSync(join(provDir, 'dashboards')).flatMap((f) => readYaml(join(provDir, 'dashboards', f)).providers);
    expect(providers.length).toBeGreaterThan(0);
    for (const p of providers) {
      expect(p.type).toBe('file');
      expect(posix.normalize(p.options.path)).toBe(dashMount!.target);
    }
  });

  it("every datasource the dashboards reference is a template variable, Grafana's own, or provisioned", () => {
    const provDir = resolve(composeDir, provMount!.source);
    const ds = readYaml(join(provDir, 'datasources/prometheus.yaml')).datasources as Obj[];
    const uids = new Set(ds.map((d) => d.uid));
    const dashDir = join(repo, 'grafana/dashboards');
    const files = existsSync(dashDir) ? readdirSync(dashDir).filter((f) => f.endsWith('.json')) : [];
    const bad: string[] = [];
    for (const f of files) {
      const walk = (o: unknown): void => {
        if (Array.isArray(o)) return o.forEach(walk);
        if (!o || typeof o !== 'object') return;
        const ref = (o as Obj).datasource;
        if (ref && typeof ref === 'object' && typeof ref.uid === 'string') {
          if (!ref.uid.startsWith('$') && ref.uid !== '-- Grafana --' && !uids.has(ref.uid)) bad.push(`${f}: ${ref.uid}`);
          if (ref.type && ref.type !== 'grafana' && !ref.uid.startsWith('$') && !ds.some((d) => d.type === ref.type)) bad.push(`${f}: type ${ref.type}`);
        }
        Object.values(o).forEach(walk);
      };
      walk(JSON.parse(readFileSync(join(dashDir, f), 'utf8')));
    }
    expect(bad).toEqual([]);
  });
});

// ---------------------------------------------------------------------------------------------
// Dockerfile and .dockerignore

interface Instr {
  op: string;
  args: string;
}
function parseDockerfile(text: string): Instr[] {
  const lines = text.split('\n');
  const out: Instr[] = [];
  let buf = '';
  for (const raw of lines) {
    if (/^\s*#/.test(raw) && buf === '') continue;
    if (/^\s*#/.test(raw)) continue; // comment inside a continuation
    const line = raw.replace(/\s+$/, '');
    if (line.endsWith('\\')) {
      buf += line.slice(0, -1) + ' ';
      continue;
    }
    buf += line;
    if (buf.trim()) {
      const m = /^\s*(\w+)\s+([\s\S]*)$/.exec(buf);
      if (m) out.push({ op: m[1]!.toUpperCase(), args: m[2]!.trim() });
    }
    buf = '';
  }
  return out;
}

function dockerfile() {
  const instrs = parseDockerfile(readFileSync(join(repo, 'deploy/Dockerfile'), 'utf8'));
  const args: Record<string, string> = {};
  const stages: { from: string; name?: string; instrs: Instr[] }[] = [];
  for (const i of instrs) {
    if (i.op === 'ARG' && stages.length === 0) {
      const [k, v] = i.args.split('=');
      args[k!] = v ?? '';
    } else if (i.op === 'FROM') {
      const [img, , name] = i.args.split(/\s+/);
      const from = img!.replace(/\$\{(\w+)\}|\$(\w+)/g, (_m, a, b) => args[a ?? b] ?? '');
      stages.push({ from, name, instrs: [] });
    } else stages.at(-1)?.instrs.push(i);
  }
  return { instrs, stages, final: stages.at(-1)! };
}

function dockerignorePatterns(): string[] {
  return readFileSync(join(repo, '.dockerignore'), 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
}
/** Good enough for the plain names and `**` prefixes this .dockerignore uses. */
function ignored(path: string, patterns: string[]): boolean {
  let result = false;
  for (const p of patterns) {
    const neg = p.startsWith('!');
    const pat = (neg ? p.slice(1) : p).replace(/^\/+/, '').replace(/\/+$/, '');
    const re = new RegExp(
      '^' +
        pat
          .split('/')
          .map((seg) => (seg === '**' ? '(?:.*/)?' : seg.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*').replace(/\?/g, '[^/]') + '/'))
          .join('')
          .replace(/\/$/, '') +
        '(?:/.*)?$',
    );
    if (re.test(path)) result = !neg;
  }
  return result;
}

describe('deploy/Dockerfile', () => {
  const { instrs, stages, final } = dockerfile();

  it('is multi-stage, every FROM pinned to a version (no latest)', () => {
    expect(stages.length).toBeGreaterThanOrEqual(2);
    for (const s of stages) {
      const named = stages.some((o) => o.name === s.from);
      if (!named) expect(imageTagProblems(s.from), s.from).toBeNull();
      if (!named) expect(s.from).toMatch(/^node:\d+\.\d+\.\d+-/);
    }
  });

  it('builds with dev dependencies in an earlier stage and ships production dependencies only', () => {
    const runs = (s: { instrs: Instr[] }) => s.instrs.filter((i) => i.op === 'RUN').map((i) => i.args).join('\n');
    const buildStage = stages.find((s) => /npm run build/.test(runs(s)));
    expect(buildStage).toBeDefined();
    expect(runs(buildStage!)).toMatch(/npm ci\b/);
    expect(buildStage).not.toBe(final);
    const all = stages.map(runs).join('\n');
    expect(all).toMatch(/npm ci --omit=dev --ignore-scripts/);
    // The final stage copies node_modules from a stage that installed with --omit=dev, or runs it itself.
    const copies = final.instrs.filter((i) => i.op === 'COPY');
    const nm = copies.find((i) => /node_modules/.test(i.args));
    if (nm) {
      const from = /--from=(\S+)/.exec(nm.args)?.[1];
      expect(runs(stages.find((s) => s.name === from)!)).toMatch(/--omit=dev/);
    } else expect(runs(final)).toMatch(/--omit=dev/);
    expect(runs(final)).not.toMatch(/npm run build|npm ci(?![^\n]*--omit=dev)/);
    expect(copies.some((i) => /--from=/.test(i.args) && /\/dist\s/.test(i.args))).toBe(true);
  });

  it('runs as a non-root numeric user, exec-form node entrypoint, ports and health check declared', () => {
    const user = final.instrs.filter((i) => i.op === 'USER').at(-1)?.args;
    expect(user).toBeDefined();
    expect(user).toMatch(/^\d+(:\d+)?$/);
    expect(user!.split(':')[0]).not.toBe('0');
    const workdir = final.instrs.filter((i) => i.op === 'WORKDIR').at(-1)!.args;
    const entry = final.instrs.filter((i) => i.op === 'ENTRYPOINT').at(-1)!.args;
    expect(JSON.parse(entry)).toEqual(['node', `${workdir}/dist/cli.js`]);
    expect(instrs.some((i) => i.op === 'CMD' && !i.args.startsWith('['))).toBe(false);
    const exposed = final.instrs.filter((i) => i.op === 'EXPOSE').flatMap((i) => i.args.split(/\s+/));
    expect(exposed).toEqual(expect.arrayContaining(['8080', '9464']));
    const hc = final.instrs.find((i) => i.op === 'HEALTHCHECK')!.args;
    expect(JSON.parse(hc.slice(hc.indexOf('CMD') + 3).trim())).toEqual(['node', `${workdir}/dist/cli.js`, 'healthcheck']);
    const env = final.instrs.filter((i) => i.op === 'ENV').map((i) => i.args).join(' ');
    expect(env).toMatch(/LLM_PROXY_HOST=0\.0\.0\.0/);
    expect(env).toMatch(/LLM_PROXY_METRICS_HOST=0\.0\.0\.0/);
    // ports are left to the proxy's defaults / config file (env would override the config file)
    expect(env).not.toMatch(/LLM_PROXY_(METRICS_)?PORT=/);
  });

  it('labels the image as package.json describes it (OCI annotation keys), and ships the licence', () => {
    const pkg = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as Record<string, string>;
    const labels: Record<string, string> = {};
    for (const i of final.instrs.filter((x) => x.op === 'LABEL')) for (const m of i.args.matchAll(/([\w.-]+)="([^"]*)"/g)) labels[m[1]!] = m[2]!;
    expect(labels).toStrictEqual({
      'org.opencontainers.image.title': pkg.name,
      'org.opencontainers.image.description': pkg.description,
      'org.opencontainers.image.version': pkg.version,
      'org.opencontainers.image.licenses': pkg.license,
    });
    // Every tag the deploy files name is that version too (the build and run lines, the manifests).
    const tags = readdirSync(join(repo, 'deploy'), { recursive: true, encoding: 'utf8' })
      .filter((f) => /(^|\/)Dockerfile$|\.(md|ya?ml)$/.test(f))
      .flatMap((f) => [...readFileSync(join(repo, 'deploy', f), 'utf8').matchAll(/\bllm-latency-proxy:(\d+\.\d+\.\d+\S*)/g)].map((m) => `${f}: ${m[1]}`));
    expect(tags.length).toBeGreaterThanOrEqual(3);
    for (const t of tags) expect(t.slice(t.indexOf(': ') + 2), t).toBe(pkg.version);
    const copied = final.instrs.filter((i) => i.op === 'COPY' && !/--from=/.test(i.args)).flatMap((i) => i.args.split(/\s+/).filter((a) => !a.startsWith('--')).slice(0, -1));
    expect(copied).toContain('LICENSE');
    expect(readFileSync(join(repo, 'LICENSE'), 'utf8')).toMatch(/Apache License\s+Version 2\.0/);
  });

  it('copies only files that exist and that .dockerignore lets into the context', () => {
    const patterns = dockerignorePatterns();
    for (const must of ['node_modules', 'dist', '.git', 'test', 'bench']) expect(patterns, must).toContain(must);
    for (const s of stages) {
      for (const i of s.instrs.filter((x) => x.op === 'COPY' && !/--from=/.test(x.args))) {
        const parts = i.args.split(/\s+/).filter((p) => !p.startsWith('--'));
        for (const src of parts.slice(0, -1)) {
          expect(existsSync(join(repo, src)), src).toBe(true);
          expect(ignored(src, patterns), `${src} is excluded by .dockerignore`).toBe(false);
        }
      }
    }
    expect(ignored('node_modules', patterns)).toBe(true);
    expect(ignored('src/node_modules/x', patterns)).toBe(true);
    expect(ignored('test/unit/a.test.ts', patterns)).toBe(true);
  });

  it('the HEALTHCHECK command exits 0 on a healthy /healthz and 1 otherwise', async () => {
    const hc = final.instrs.find((i) => i.op === 'HEALTHCHECK')!.args;
    const argv = JSON.parse(hc.slice(hc.indexOf('CMD') + 3).trim()) as string[];
    expect(argv[0]).toBe('node');
    let status = 200;
    const seen: string[] = [];
    const server = createServer((req, res) => {
      seen.push(req.url!);
      res.writeHead(status).end('ok');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    // async spawn: the server runs in this process and must keep answering while the check runs
    const run = (p: number) =>
      new Promise<number | null>((done) => {
        // The image's WORKDIR is the repository root here.
        const workdir = final.instrs.filter((i) => i.op === 'WORKDIR').at(-1)!.args;
        const args = argv.slice(1).map((a) => (a.startsWith(`${workdir}/`) ? join(repo, a.slice(workdir.length + 1)) : a));
        const child = spawn(process.execPath, args, {
          env: { ...process.env, LLM_PROXY_METRICS_PORT: String(p) },
          stdio: 'ignore',
          timeout: 10_000,
        });
        child.on('exit', (code) => done(code));
      });
    try {
      expect(await run(port)).toBe(0);
      status = 503;
      expect(await run(port)).toBe(1);
    } finally {
      await new Promise((r) => server.close(r));
    }
    expect(await run(port)).toBe(1); // nothing listening
    expect(seen).toEqual(['/healthz', '/healthz']);
  });
});

// ---------------------------------------------------------------------------------------------
// Load generator

interface Captured {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Obj;
}
async function sseServer(handler: (req: Captured, res: ServerResponse) => void) {
  const requests: Captured[] = [];
  const server: Server = createServer((req, res) => {
    let data = '';
    req.on('data', (c) => (data += c));
    req.on('end', () => {
      const captured = { method: req.method!, url: req.url!, headers: req.headers, body: data ? JSON.parse(data) : {} };
      requests.push(captured);
      handler(captured, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, requests, close: () => new Promise((r) => server.close(r)) };
}

function streamOk(req: Captured, res: ServerResponse) {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  const chunk = (delta: Obj, extra: Obj = {}) =>
    `data: ${JSON.stringify({ object: 'chat.completion.chunk', model: req.body.model, choices: [{ index: 0, delta }], ...extra })}\n\n`;
  res.write(chunk({ role: 'assistant', content: '' }));
  let i = 0;
  const t = setInterval(() => {
    if (i < 3) res.write(chunk({ content: `tok${i++}` }));
    else {
      clearInterval(t);
      res.write(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 3 } })}\n\n`);
      res.end('data: [DONE]\n\n');
    }
  }, 5);
}

function runLoadgen(env: Record<string, string>) {
  return new Promise<{ code: number | null; lines: Obj[] }>((resolveRun, reject) => {
    const child = spawn(process.execPath, [join(composeDir, 'loadgen.mjs')], {
      env: { PATH: process.env.PATH ?? '', LOADGEN_REPORT_MS: '0', ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (c) => (out += c));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`loadgen did not finish in time; output:\n${out}`));
    }, 20_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolveRun({ code, lines: out.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)) });
    });
  });
}

describe('deploy/compose/loadgen.mjs (bounded runs against a local server)', () => {
  it('sends the requested number of streaming chat completions and reads them to the end', async () => {
    const srv = await sseServer(streamOk);
    try {
      const { code, lines } = await runLoadgen({ LOADGEN_TARGET: srv.url, LOADGEN_RATE: '50', LOADGEN_MAX_REQUESTS: '5', LOADGEN_MODELS: 'm-a,m-b' });
      expect(code).toBe(0);
      expect(srv.requests).toHaveLength(5);
      for (const r of srv.requests) {
        expect(r.method).toBe('POST');
        expect(r.url).toBe('/v1/chat/completions');
        expect(r.body.stream).toBe(true);
        expect(r.body.stream_options).toEqual({ include_usage: true });
        expect(r.body.messages[0].role).toBe('user');
        expect(r.body.max_tokens).toBeGreaterThanOrEqual(2);
        expect(r.headers.authorization).toMatch(/^Bearer /);
      }
      expect(new Set(srv.requests.map((r) => r.body.model))).toEqual(new Set(['m-a', 'm-b']));
      const done = lines.at(-1)!;
      expect(done.msg).toBe('loadgen done');
      expect(done).toMatchObject({ sent: 5, ok: 5, failed: 0, inflight: 0 });
      expect(done.events).toBe(5 * 6); // role + 3 tokens + usage + [DONE]
    } finally {
      await srv.close();
    }
  });

  it('counts failures and exits 1 when a bounded run had errors', async () => {
    const srv = await sseServer((_req, res) => res.writeHead(500).end('{"error":"boom"}'));
    try {
      const { code, lines } = await runLoadgen({ LOADGEN_TARGET: srv.url, LOADGEN_RATE: '50', LOADGEN_MAX_REQUESTS: '3' });
      expect(code).toBe(1);
      expect(lines.at(-1)).toMatchObject({ sent: 3, ok: 0, failed: 3, errors: { 'HTTP 500': 3 } });
    } finally {
      await srv.close();
    }
  });

  it('sends nothing when the proxy upstream is a real provider', async () => {
    const srv = await sseServer(streamOk);
    try {
      const { code, lines } = await runLoadgen({
        LOADGEN_TARGET: srv.url,
        LOADGEN_MAX_REQUESTS: '3',
        LOADGEN_UPSTREAM: 'https://api.openai.com',
        LOADGEN_SIMULATOR_URL: 'http://simulator:8081',
      });
      expect(code).toBe(0);
      expect(srv.requests).toHaveLength(0);
      expect(lines[0]?.msg).toMatch(/not generating load/);
    } finally {
      await srv.close();
    }
  });
});
