import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

// Three projects so CI can run the fast, pure unit tests on a second Node line
// (`--project unit`) while the whole suite runs on the primary one.
export default defineConfig({
  test: {
    // The second names the tests that took 40% or more of their timeout (the next to fail by time).
    reporters: ['default', ['./test/helpers/timeout-share-reporter.ts', { share: 0.4 }]],
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: 60_000,
          // Vitest's default is one worker less than the cores: one on a 2-core machine, which ran
          // the unit files one at a time (194 s; 115 s with two). The few that bound wall-clock
          // time (loop delay, runtime metrics, WebSocket idle timers) do so with wide margins,
          // and held in repeated runs beside two busy loops. The integration and e2e files still
          // run after them, one at a time (a project without file parallelism runs last).
          maxWorkers: Math.max(2, availableParallelism() - 1),
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          testTimeout: 120_000,
          hookTimeout: 120_000,
          pool: 'forks',
          // Timing-based assertions hold on a loaded 2-core machine only if
          // integration files do not compete with each other for the CPU.
          fileParallelism: false,
        },
      },
      {
        test: {
          name: 'e2e',
          include: ['test/e2e/**/*.test.ts'],
          testTimeout: 600_000,
          hookTimeout: 600_000,
          pool: 'forks',
          fileParallelism: false,
        },
      },
    ],
  },
});
