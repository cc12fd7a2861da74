// A vitest reporter that names, after the summary, the tests that used a large share of their
// timeout: on a loaded 2-core machine such a test is the next to fail by time alone (CI of
// 61db4fc failed on a property test that had taken 6-48 s of its 60 s in earlier suites, where
// nothing printed that margin). It fails nothing; it only prints.
import type { Reporter, TestCase, TestModule } from 'vitest/node';

export interface Timed {
  name: string;
  durationMs: number;
  timeoutMs: number;
}

/** The tests at or over `share` of their timeout, the closest first. */
export function closeToTimeout(tests: readonly Timed[], share: number): Timed[] {
  return tests.filter((t) => t.timeoutMs > 0 && t.durationMs >= share * t.timeoutMs).sort((a, b) => b.durationMs / b.timeoutMs - a.durationMs / a.timeoutMs);
}

export function renderCloseToTimeout(close: readonly Timed[], share: number): string {
  if (close.length === 0) return '';
  const lines = close.map((t) => `  ${Math.round((100 * t.durationMs) / t.timeoutMs)}%  ${(t.durationMs / 1000).toFixed(1)} s of ${(t.timeoutMs / 1000).toFixed(0)} s  ${t.name}`);
  return `\n Tests that took ${Math.round(share * 100)}% or more of their timeout (a loaded machine may push them over):\n${lines.join('\n')}\n`;
}

export default class TimeoutShareReporter implements Reporter {
  private readonly timed: Timed[] = [];
  private readonly share: number;
  constructor(options: { share?: number } = {}) {
    this.share = options.share ?? 0.4;
  }

  onTestCaseResult(test: TestCase): void {
    const durationMs = test.diagnostic()?.duration;
    // The runner's task carries the timeout the test ran with ({ timeout } or the project's).
    const timeoutMs = (test as unknown as { task?: { timeout?: number } }).task?.timeout ?? test.project.config.testTimeout;
    if (durationMs !== undefined && timeoutMs) {
      this.timed.push({ name: `${test.project.name} ${test.module.relativeModuleId} > ${test.fullName}`, durationMs, timeoutMs });
    }
  }

  onTestRunEnd(_modules: ReadonlyArray<TestModule>): void {
    const text = renderCloseToTimeout(closeToTimeout(this.timed, this.share), this.share);
    if (text) process.stdout.write(text);
    this.timed.length = 0;
  }
}
