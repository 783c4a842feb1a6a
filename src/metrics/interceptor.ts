import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import type { Metrics } from "./metrics.js";

/**
 * Counts every RPC and observes its duration by service, method and code
 * (`ok`, or the Connect code name of the error the client got, or of the
 * call's abort when the client left or its deadline passed). Outermost,
 * so that the code is the one sent after error mapping, and refusals of
 * authentication are counted too. A server stream is counted when it ends:
 * normally, with an error, or when the client went away or its deadline
 * passed (the code of the call's abort: `canceled`, `deadline_exceeded`),
 * even when the handler then ended the stream quietly.
 */
export function createMetricsInterceptor(
  metrics: Pick<Metrics, "rpcRequests" | "rpcDuration">,
): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    let counted = false;
    const count = (code: string) => {
      if (counted) return;
      counted = true;
      // One label object for both (startTimer would build two more).
      const labels = { service: req.service.typeName, method: req.method.name, code };
      metrics.rpcDuration.observe(labels, (performance.now() - started) / 1000);
      metrics.rpcRequests.inc(labels);
    };
    const codeOf = (error: unknown) => codeToString(ConnectError.from(error).code);
    // A call its client left, or whose deadline passed, may still end
    // quietly (a long poll answers "nothing"): it counts as aborted.
    const ended = () => (req.signal.aborted ? codeOf(req.signal.reason) : "ok");
    let res: Awaited<ReturnType<typeof next>>;
    try {
      res = await next(req);
    } catch (error) {
      count(codeOf(error));
      throw error;
    }
    if (!res.stream) {
      count(ended());
      return res;
    }
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* messages;
          count(ended());
        } catch (error) {
          count(codeOf(error));
          throw error;
        } finally {
          // Left before its end: whoever read the stream stopped.
          count(codeToString(Code.Canceled));
        }
      })(),
    } as typeof res;
  };
}
