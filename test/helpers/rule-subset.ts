// The part of a Prometheus rule file that a rule change can affect, and a promtool test file cut
// to the cases that look at it. A mutation run of the rules tests then evaluates only the changed
// rules and the recorded series they read: regression.test.yaml's synthetic week took 22 s with
// every rule and takes 6 s with one alert and its three recording rules.
//
// Why the cut changes no verdict it keeps: a rule reads input series and recorded series by name
// (these rules use no `ALERTS` series and no `__name__` matchers; `namesRead` is how a rule names
// what it reads), so a kept rule sees the same samples, evaluated in the same group order, with
// or without the rules dropped beside it. The callers also run the committed rules cut the same
// way and require them to pass, so a cut that broke a case would show.
import YAML from 'yaml';

export interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  [key: string]: unknown;
}
export interface RuleDoc {
  groups: Array<{ name: string; rules: Rule[]; [key: string]: unknown }>;
}
interface TestGroup {
  alert_rule_test?: Array<{ alertname: string }>;
  promql_expr_test?: Array<{ expr: string }>;
  [key: string]: unknown;
}
export interface TestDoc {
  tests: TestGroup[];
  [key: string]: unknown;
}

/** What to keep: alerts by name, recording rules by the name they record. */
export interface Kept {
  alerts: Set<string>;
  records: Set<string>;
}

/** The recorded names (of `doc`'s recording rules) that `text` mentions. */
export function namesRead(text: string, recorded: ReadonlySet<string>): string[] {
  return [...text.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)].map((m) => m[0]).filter((n) => recorded.has(n));
}

const rules = (doc: RuleDoc) => doc.groups.flatMap((g) => g.rules);

/** Every text of a rule that Prometheus evaluates: its expression and its templates (`query`). */
const evaluated = (r: Rule) => [r.expr, ...Object.values((r.annotations as Record<string, string> | undefined) ?? {}), ...Object.values((r.labels as Record<string, string> | undefined) ?? {})].join('\n');

/** The recorded names that `texts` read, and those that their recording rules read, transitively. */
function closure(doc: RuleDoc, texts: string[]): Set<string> {
  const recorded = new Set(rules(doc).flatMap((r) => (r.record ? [r.record] : [])));
  const out = new Set<string>();
  const visit = (text: string) => {
    for (const n of namesRead(text, recorded)) {
      if (out.has(n)) continue;
      out.add(n);
      for (const r of rules(doc)) if (r.record === n) visit(evaluated(r));
    }
  };
  texts.forEach(visit);
  return out;
}

/**
 * The rules of `mutated` that differ from `committed` (compared rule by rule, in place), every
 * rule that reads a changed recording rule (a PromQL case may read a recording rule no alert
 * does), and every recording rule those read. Null when the two files differ in shape (a rule
 * added, removed or moved) or in a group's settings (its name, interval, limit): the caller then
 * keeps everything.
 */
export function changedSubset(committed: RuleDoc, mutated: RuleDoc): Kept | null {
  const a = rules(committed);
  const b = rules(mutated);
  const settings = (g: RuleDoc['groups'][number]) => JSON.stringify({ ...g, rules: undefined });
  const sameShape =
    committed.groups.length === mutated.groups.length &&
    committed.groups.every((g, i) => settings(g) === settings(mutated.groups[i]!) && g.rules.length === mutated.groups[i]!.rules.length) &&
    a.every((r, i) => r.record === b[i]!.record && r.alert === b[i]!.alert);
  if (!sameShape) return null;
  const changed = b.filter((r, i) => JSON.stringify(r) !== JSON.stringify(a[i]));
  const changedRecords = new Set(changed.flatMap((r) => (r.record ? [r.record] : [])));
  const kept = b.filter((r) => changed.includes(r) || [...closure(mutated, [evaluated(r)])].some((n) => changedRecords.has(n)));
  const alerts = new Set(kept.flatMap((r) => (r.alert ? [r.alert] : [])));
  const records = closure(mutated, kept.map(evaluated));
  for (const r of kept) if (r.record) records.add(r.record);
  return { alerts, records };
}

/** `doc` with only the kept rules, every group left in place (an empty group is valid). */
export function pruneRules(doc: RuleDoc, keep: Kept): RuleDoc {
  return {
    ...doc,
    groups: doc.groups.map((g) => ({ ...g, rules: g.rules.filter((r) => (r.alert ? keep.alerts.has(r.alert) : keep.records.has(r.record!))) })),
  };
}

/**
 * `tests` with the alert cases of kept alerts and the PromQL cases whose recorded names are all
 * kept (one that reads input series only stays in every cut); a test group left with no case is
 * dropped (its series would be evaluated for nothing).
 */
export function pruneTests(tests: TestDoc, keep: Kept, allRecorded: ReadonlySet<string>): TestDoc {
  const groups = tests.tests
    .map((t) => ({
      ...t,
      alert_rule_test: (t.alert_rule_test ?? []).filter((c) => keep.alerts.has(c.alertname)),
      promql_expr_test: (t.promql_expr_test ?? []).filter((c) => namesRead(c.expr, allRecorded).every((n) => keep.records.has(n))),
    }))
    .filter((t) => t.alert_rule_test.length + t.promql_expr_test.length > 0);
  return { ...tests, tests: groups };
}

/** Both files cut to `keep` (null: uncut), as YAML, with the number of cases left. */
export function cutFiles(rulesYaml: string, testsYaml: string, keep: Kept | null): { rules: string; tests: string; cases: number } {
  const doc = YAML.parse(rulesYaml) as RuleDoc;
  const tests = YAML.parse(testsYaml) as TestDoc;
  const count = (t: TestDoc) => t.tests.reduce((n, g) => n + (g.alert_rule_test?.length ?? 0) + (g.promql_expr_test?.length ?? 0), 0);
  if (!keep) return { rules: rulesYaml, tests: testsYaml, cases: count(tests) };
  const recorded = new Set(rules(doc).flatMap((r) => (r.record ? [r.record] : [])));
  const cut = pruneTests(tests, keep, recorded);
  return { rules: YAML.stringify(pruneRules(doc, keep), { lineWidth: 0 }), tests: YAML.stringify(cut, { lineWidth: 0 }), cases: count(cut) };
}
