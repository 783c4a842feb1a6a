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
 * When the database refuses the shared statement (it answered with an
 * error, so nothing was completed: a deadlock, a timeout, one call's data
 * it could not take), each call goes again alone and gets its own answer:
 * one call never fails the others, as claims do (store.ts). A failure
 * without an answer (the connection lost) runs the whole statement once
 * more: a completion is safe to send again, an identical repeat being
 * accepted, though a statement that committed before its answer was lost
 * then answers its completions as repeats.
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
        if (calls.length === 1 || !answeredWithError(error)) throw error;
        return Promise.all(
          calls.map((call) =>
            complete(call).then(
              (outcomes) => outcomes,
              (alone: unknown) => (alone instanceof Error ? alone : new Error(String(alone))),
            ),
          ),
        );
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
