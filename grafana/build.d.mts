// Types for grafana/build.mjs (a plain ESM script so it runs without a build step).
export const GRAFANA_DIR: string;
export const PARAMS_FILE: string;
export const METRICS: Readonly<Record<string, string>>;
export const GAP_BUCKETS: readonly number[];
export const DASHBOARD_UID: string;
export const OUTPUT_FILES: Readonly<{ rules: string; prometheusRule: string; dashboard: string }>;

export interface AlertParams {
  for: string;
  severity: string;
  [key: string]: unknown;
}
/** An alert judged by the share of slow steps: above its threshold in `share` of the steps of `over`. */
export type ShareParams = AlertParams & { over: string; share: number; minRequestRate: number };
/** An "against the past" alert: above `factor` x its baseline in `share` of the steps of `over`. */
export type RegressionParams = ShareParams & { factor: number };
export interface Params {
  selector: string;
  groupBy: string[];
  instanceLabels: string[];
  window: string;
  rangeWindow?: string;
  quantiles: number[];
  comparison: { day: string; week: string };
  runbookUrl: string;
  groups: { recording: string; alerts: string };
  /** The proxy's metrics.buckets.itl when it sets its own (default: GAP_BUCKETS). */
  gapBuckets?: number[];
  alerts: Record<string, AlertParams> & {
    itlRegression: RegressionParams;
    ttftRegression: RegressionParams;
    itlTailRegression: RegressionParams;
    errorRatio: AlertParams & { threshold: number; minRequestRate: number };
    itlObjective: ShareParams & { defaultSeconds: number; perModel: Record<string, number> };
    stalls: AlertParams & { gapSeconds: number; threshold: number; minRequestRate: number };
    noData: AlertParams & { lookback: string; minRequestRate: number };
    proxyDown: AlertParams & { lookback: string };
  };
}
export interface RecordingRule {
  record: string;
  expr: string;
  labels?: Record<string, string>;
}
export interface AlertRule {
  alert: string;
  expr: string;
  for: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
}
export interface DashboardTarget {
  expr: string;
  refId: string;
  legendFormat?: string;
  [key: string]: unknown;
}
export interface DashboardPanel {
  id: number;
  type: string;
  title: string;
  description?: string;
  gridPos: { h: number; w: number; x: number; y: number };
  targets?: DashboardTarget[];
  panels?: DashboardPanel[];
  [key: string]: unknown;
}

export function loadParams(file?: string): Params;
export function validateParams(p: Params): void;
export function scaleDurations(
  params: Params,
  scale: { window: string; day: string; week: string; forDuration: string; lookback: string },
): Params;
export function names(p: Params): Record<string, any>;
export function recordingRules(p: Params): RecordingRule[];
export function alertRules(p: Params): AlertRule[];
export function ruleGroups(p: Params): Array<{ name: string; rules: Array<RecordingRule | AlertRule> }>;
export function renderRulesFile(p: Params): string;
export function renderPrometheusRule(p: Params): string;
export function dashboardFilters(p: Params): Record<string, string>;
export function renderDashboard(p: Params): string;
export function dashboardTargets(dashboard: { panels: DashboardPanel[] }): Array<{ panel: DashboardPanel; target: DashboardTarget }>;
export function expandDashboardExpr(expr: string, vars: Record<string, string>): string;
export function renderAll(p: Params): Record<string, string>;
export function staleFiles(p?: Params, dir?: string): string[];
