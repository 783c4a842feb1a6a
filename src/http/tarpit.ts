import type { EventEmitter } from "node:events";

/**
 * Slows down a source that keeps failing to authenticate: its refusals
 * (429, `AUTH_THROTTLED`) are answered after `delayMs` instead of at once,
 * so that each of its connections makes one guess a `delayMs`, and a flood
 * costs the coordinator a timer per request instead of a request's work
 * many thousand times a second. Bounded: at most `perSource` refusals of
 * one source and `total` of all wait at once, and a held request's unread
 * body can buffer at most `maxBytesEach` (its declared length, or what
 * HTTP/2 flow control lets it send unread), all of them `maxBytes`; beyond
 * any bound the refusal is answered at once and its body dropped, so
 * holding them never grows memory without bound.
 */
export function createTarpit(options: {
  delayMs: number;
  perSource: number;
  total: number;
  maxBytesEach: number;
  maxBytes: number;
}) {
  const held = new Map<string, number>();
  let total = 0;
  let bytes = 0;
  return {
    /**
     * Runs `answer` after the delay and returns true, or returns false
     * (answer now) when the bounds are reached. A response that closes
     * meanwhile (the client left) is let go without an answer. `mayBuffer`
     * is what the request's body can pile up unread meanwhile.
     */
    hold(
      source: string | undefined,
      res: EventEmitter,
      answer: () => void,
      mayBuffer = 0,
    ): boolean {
      if (options.delayMs <= 0 || source === undefined) return false;
      const mine = held.get(source) ?? 0;
      if (mine >= options.perSource || total >= options.total) return false;
      if (mayBuffer > options.maxBytesEach || bytes + mayBuffer > options.maxBytes) return false;
      held.set(source, mine + 1);
      total++;
      bytes += mayBuffer;
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        clearTimeout(timer);
        res.off("close", release);
        total--;
        bytes -= mayBuffer;
        const left = (held.get(source) ?? 1) - 1;
        if (left === 0) held.delete(source);
        else held.set(source, left);
      };
      const timer = setTimeout(() => {
        release();
        answer();
      }, options.delayMs);
      res.once("close", release);
      return true;
    },
  };
}

export type Tarpit = ReturnType<typeof createTarpit>;
