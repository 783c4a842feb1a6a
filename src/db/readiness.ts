/**
 * Whether the database answers, as /readyz and grpc.health.v1.Health tell
 * it: one ping at a time whoever asks, its answer kept for `cacheMs`, and a
 * ping that takes longer than `timeoutMs` counted as an answer of no (a
 * driver may wait far longer to reconnect). Anyone may ask, without a token:
 * a flood of asks costs one ping per `cacheMs`, never a pool connection each.
 */
export function createReadiness(
  ping: () => Promise<void>,
  options: { cacheMs: number; timeoutMs: number },
) {
  let inFlight: Promise<boolean> | undefined;
  let last: { ready: boolean; at: number } | undefined;
  return function ready(): Promise<boolean> {
    if (last && Date.now() - last.at < options.cacheMs) return Promise.resolve(last.ready);
    if (inFlight) return inFlight;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), options.timeoutMs);
    });
    inFlight = Promise.race([
      ping().then(
        () => true,
        () => false,
      ),
      timeout,
    ]).then((ready) => {
      clearTimeout(timer);
      last = { ready, at: Date.now() };
      inFlight = undefined;
      return ready;
    });
    return inFlight;
  };
}
