/** Who took the final scrape, for its log line. */
export interface ScrapeClient {
  readonly address: string | undefined;
  readonly userAgent: string | undefined;
}

/**
 * The last scrape of a shutting-down proxy. The metrics port is scraped during the drain, but
 * what is recorded after the last of those scrapes (the streams cut at the deadline, those that
 * ended since) was lost when the port closed with the process. With `metrics.finalScrapeWait`
 * the port stays open after the drain until one scrape collected after it has been sent whole,
 * or the wait ends.
 */
export class FinalScrape {
  private waiter: { since: number; done: (by: ScrapeClient | undefined) => void } | undefined;

  /**
   * A `GET /metrics` whose answer was sent in full; `collectedAt` is when its collection began
   * (`performance.now()`), so one begun before the drain ended, which may lack its last records,
   * does not count.
   */
  served(collectedAt: number, by: ScrapeClient): void {
    const w = this.waiter;
    if (w !== undefined && collectedAt >= w.since) {
      this.waiter = undefined;
      w.done(by);
    }
  }

  /** Ends a wait under way (undefined): the proxy is being closed at once. */
  cancel(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.done(undefined);
  }

  /** Who took the first scrape collected at or after `since`; undefined after `ms` without one. */
  wait(since: number, ms: number): Promise<ScrapeClient | undefined> {
    this.cancel();
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        if (this.waiter === waiter) this.waiter = undefined;
        resolve(undefined);
      }, ms);
      const waiter = {
        since,
        done: (by: ScrapeClient | undefined) => {
          clearTimeout(timer);
          resolve(by);
        },
      };
      this.waiter = waiter;
    });
  }
}
