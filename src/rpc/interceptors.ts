import { Code, type Interceptor, type StreamRequest, type UnaryRequest } from "@connectrpc/connect";
import { invalid } from "../core/errors.js";
import { nulPath } from "../core/validate.js";
import type { Logger } from "../log.js";
import { kCorrelationId } from "./context.js";
import type { ToClientError } from "./errors.js";

/**
 * Logs every RPC with its correlation id, method, code and duration, and
 * turns whatever a handler throws into what a client may see (`toClientError`,
 * from rpc/errors.ts):
 * store refusals keep their code and reason, anything unexpected becomes
 * `internal error` and is logged in full, never sent. Streaming responses
 * are wrapped too, since their errors surface while the stream is read.
 */
export function createRpcInterceptor(log: Logger, toClientError: ToClientError): Interceptor {
  return (next) => async (req) => {
    const started = performance.now();
    const rpcLog = log.child({
      correlation_id: req.contextValues.get(kCorrelationId),
      rpc: `${req.service.typeName}/${req.method.name}`,
    });
    const finish = (error: unknown) => {
      const ms = Math.round((performance.now() - started) * 10) / 10;
      if (error === undefined) {
        rpcLog.debug({ code: "ok", ms }, "rpc");
        return undefined;
      }
      const mapped = toClientError(error);
      if (mapped.unexpected) rpcLog.error({ err: error, code: "internal", ms }, "rpc failed");
      else if (mapped.error.code === Code.Unavailable)
        rpcLog.warn({ err: error, code: "unavailable", ms }, "rpc failed: unavailable");
      else
        rpcLog.info({ code: mapped.error.code, reason: mapped.error.message, ms }, "rpc refused");
      return mapped.error;
    };
    let res: Awaited<ReturnType<typeof next>>;
    try {
      res = await next(req);
    } catch (error) {
      throw finish(error);
    }
    if (!res.stream) {
      finish(undefined);
      return res;
    }
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* messages;
        } catch (error) {
          throw finish(error);
        }
        finish(undefined);
      })(),
    } as typeof res;
  };
}

/**
 * Refuses a request message holding a string with U+0000 (core/validate.ts,
 * nulPath) with `invalid_argument`, before the handler sees it: PostgreSQL
 * cannot store or compare such a string, and the statement would fail as an
 * unexpected error. Every message of a stream is checked as it arrives.
 */
export function createNulInterceptor(): Interceptor {
  const check = (message: unknown) => {
    const path = nulPath(message);
    if (path !== undefined) throw invalid(`${path} must not contain U+0000 (NUL)`);
  };
  return (next) => async (req) => next(await checkEachMessage(req, check));
}

/**
 * Runs `check` on a request's message before the handler sees it: at once
 * for a unary call, on each message of a stream as it arrives. The request
 * to pass on is returned (a stream's messages wrapped).
 */
export async function checkEachMessage<R extends UnaryRequest | StreamRequest>(
  req: R,
  check: (message: unknown) => unknown,
): Promise<R> {
  if (!req.stream) {
    await check(req.message);
    return req;
  }
  const messages = req.message;
  return {
    ...req,
    message: (async function* () {
      for await (const m of messages) {
        await check(m);
        yield m;
      }
    })(),
  };
}
