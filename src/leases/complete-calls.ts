import { answeredWithError, isTransientDatabaseError } from "../db/faults.js";
import { createBatcher } from "./batcher.js";
import type { Completion } from "./completion.js";
import type { Outcome } from "./store.js";

/**
 * Group commit for completions: the CompleteTask and CompleteTasks calls
 * made while one completion statement runs share the next (createBatcher),
 * each call's completions kept together, at most 1,000 in one statement.
 * Each call gets its own outcomes, in order.
 *
 * When the database refuses the shared statement for good (it answered
 * with an error that is not a transient fault: one call's data it could
 * not take), each call goes again alone, one after the other, and gets its
 * own answer: one call never fails the others. A transient fault (a
 * deadlock, a timeout, too many connections, the connection lost) runs the
 * whole statement once more instead, so that a strained database does not
 * get one statement per call. A completion is safe to send again, an
 * identical repeat being accepted; but what was committed before the
 * failure (a statement whose answer was lost, or the read of the refused
 * items that follows it in store.ts, when that read failed twice) is then
 * answered as repeats.
 */
export function createCompleteCalls(complete: (items: Completion[]) => Promise<Outcome[]>) {
  const grouped = createBatcher(
    async (calls: Completion[][]): Promise<(Outcome[] | Error)[]> => {
      try {
        const outcomes = await complete(calls.flat());
        let at = 0;
        return calls.map((call) => {
          const mine = outcomes.slice(at, at + call.length);
          at += call.length;
          return mine;
        });
      } catch (error) {
        const forGood = answeredWithError(error) && !isTransientDatabaseError(error);
        if (calls.length === 1 || !forGood) throw error;
        const answers: (Outcome[] | Error)[] = [];
        for (const call of calls) {
          answers.push(
            await complete(call).catch((alone: unknown) =>
              alone instanceof Error ? alone : new Error(String(alone)),
            ),
          );
        }
        return answers;
      }
    },
    { maxBatch: 1000, size: (call) => call.length, retryable: isTransientDatabaseError },
  );
  return async (completions: Completion[]): Promise<Outcome[]> => {
    const outcomes = await grouped(completions);
    if (outcomes instanceof Error) throw outcomes;
    return outcomes;
  };
}
