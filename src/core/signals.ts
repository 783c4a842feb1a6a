/**
 * A signal that aborts when any of `signals` does, with the first one's
 * reason, and `dispose` to unlink it once the work it guards is over.
 *
 * Not `AbortSignal.any`: on Node 20 a signal made by it from a long-lived
 * one (the server's shutdown signal) stays referenced by that signal until
 * the long-lived one aborts or is collected, once a listener was added to
 * it (nodejs/node#54614, #55351): every long poll and stream left one
 * behind, and the coordinator's memory grew with each. Here the listeners
 * are removed when the work ends, so nothing outlives it.
 */
export function linkedSignal(...signals: AbortSignal[]): { signal: AbortSignal; dispose(): void } {
  const controller = new AbortController();
  const aborted = signals.find((s) => s.aborted);
  if (aborted) {
    controller.abort(aborted.reason);
    return { signal: controller.signal, dispose() {} };
  }
  const onAbort = function (this: AbortSignal) {
    dispose();
    controller.abort(this.reason);
  };
  const dispose = () => {
    for (const s of signals) s.removeEventListener("abort", onAbort);
  };
  for (const s of signals) s.addEventListener("abort", onAbort);
  return { signal: controller.signal, dispose };
}

/**
 * What a watcher (WatchTask, WatchTaskLogs) sleeps on between reads:
 * `wait(ms)` ends after `ms`, when `signal` aborts, or at `wake()`,
 * whichever comes first; `woken()` says whether `wake()` was called since
 * the last time it was asked (a change that came while the watcher read).
 */
export function createWaker(signal: AbortSignal) {
  let woken = false;
  let done: (() => void) | undefined;
  return {
    wake(): void {
      woken = true;
      done?.();
    },
    woken(): boolean {
      const was = woken;
      woken = false;
      return was;
    },
    wait(ms: number): Promise<void> {
      return new Promise<void>((resolve) => {
        const timer = setTimeout(end, ms);
        signal.addEventListener("abort", end, { once: true });
        done = end;
        function end() {
          clearTimeout(timer);
          signal.removeEventListener("abort", end);
          done = undefined;
          resolve();
        }
      });
    },
  };
}
