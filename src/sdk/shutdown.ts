import type { Completions } from "./completions.js";
import { release } from "./report.js";
import { retrying, sleep } from "./rpc.js";
import type { Session } from "./session.js";

/**
 * The stop of a registered worker, once it claims no more: running handlers
 * get the grace period (cut short by a second signal, `hurry`), the tasks
 * still running then are released with their checkpoints, outcomes already
 * being sent are waited for, and the worker is drained or deregistered
 * (`onStop`).
 */
export async function shutdown(s: Session, completions: Completions): Promise<void> {
  const { options, log, running, hurry, timeoutMs, workerId } = s;
  if (!workerId) return;
  // With onStop "drain", drained at once, so that the fleet shows it
  // stopping and nothing is pushed to it meanwhile. Not when it is to be
  // deregistered: if that failed, a restart with the same peer_id would
  // find the worker drained, and take no work.
  const drained =
    s.gone || options.onStop !== "drain"
      ? Promise.resolve(false)
      : retrying(() => s.fleet.drainWorker({ workerId, drained: true }, { timeoutMs }), {
          tries: 3,
        }).then(
          () => true,
          (error: unknown) => {
            log(`could not drain worker ${workerId}: ${(error as Error).message}`);
            return false;
          },
        );
  if (running.size > 0) {
    log(`stopping: waiting up to ${s.graceMs} ms for ${running.size} running task(s)`);
    const all = Promise.all([...running.values()].map((r) => r.finished));
    const grace = new AbortController();
    const skip = () => grace.abort();
    hurry.signal.addEventListener("abort", skip, { once: true });
    await Promise.race([all, sleep(s.graceMs, grace.signal)]);
    grace.abort(); // no timer keeps the process alive once the tasks are done
    hurry.signal.removeEventListener("abort", skip);
  }
  // Past the grace: handlers still running lose their tasks; outcomes already
  // being sent are waited for (a second signal, `hurry`, cuts their calls).
  const left = [...running.values()];
  await Promise.all(left.filter((r) => !r.settled && !r.ended).map((r) => release(s, r)));
  await completions.flushNow();
  await Promise.all(left.filter((r) => r.settled).map((r) => r.finished));
  running.clear();
  await s.keeper?.stop();
  if (s.gone) return;
  try {
    if (options.onStop === "drain") {
      if (!(await drained)) {
        await retrying(() => s.fleet.drainWorker({ workerId, drained: true }, { timeoutMs }), {
          tries: 3,
        });
      }
      log(`worker ${workerId} drained`);
    } else {
      await retrying(() => s.fleet.deregisterWorker({ workerId }, { timeoutMs }), { tries: 3 });
      log(`worker ${workerId} deregistered`);
    }
  } catch (error) {
    log(
      `could not ${options.onStop ?? "deregister"} worker ${workerId}: ${(error as Error).message}`,
    );
  }
}

/**
 * Stops the worker on SIGTERM or SIGINT; a second signal skips what is left
 * of the grace period (`hurry`). The handlers are removed once `done` settles.
 */
export function stopOnSignals(s: Session, stop: () => Promise<void>, done: Promise<void>): void {
  const onSignal = (signal: NodeJS.Signals) => {
    if (!s.stopping.signal.aborted) {
      s.log(`${signal}: stopping (again to release running tasks at once)`);
      stop().catch(() => {});
    } else {
      s.log(`${signal} again: releasing running tasks now`);
      s.hurry.abort();
    }
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);
  const off = () => {
    process.off("SIGTERM", onSignal);
    process.off("SIGINT", onSignal);
  };
  done.then(off, off);
}
