import { defineConfig } from 'vitest/config';

// Three projects so CI can run the fast, pure unit tests on a second Node line
// (`--project unit`) while the whole suite runs on the primary one.
export default defineConfig({
  test: {
    reporters: ['default'],
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: 60_000,
          // Vitest's default is one worker less than the cores: one on this 2-core machine, which
          // ran the unit files one at a time (194 s). They measure no wall-clock time, so both
          // cores; the integration and e2e files still run after them, one at a time.
          maxWorkers: 2,
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
