import { UsageError } from "./args.js";

/** Edit distance between two short words (insertions, deletions, substitutions). */
function distance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      row[j] = Math.min(
        (prev[j] ?? 0) + 1,
        (row[j - 1] ?? 0) + 1,
        (prev[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    prev = row;
  }
  return prev[b.length] ?? 0;
}

/** The known word closest to `word`, when it is close enough to be a typo ("lst" → "list"). */
export function closest(word: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const k of known) {
    const d = k.startsWith(word) && word.length >= 2 ? 0 : distance(word, k);
    if (d < bestDistance) {
      best = k;
      bestDistance = d;
    }
  }
  return bestDistance <= Math.max(1, Math.floor((best?.length ?? 0) / 3)) ? best : undefined;
}

/**
 * The error for a subcommand that does not exist: one line naming it, a
 * suggestion when it looks like a typo, and the parent command's help.
 */
export function unknownSubcommand(sub: string, known: readonly string[], parent = ""): UsageError {
  const near = closest(sub, known);
  const error = new UsageError(
    `unknown subcommand ${JSON.stringify(sub.slice(0, 64))}${near ? ` (did you mean ${JSON.stringify(near)}?)` : `; one of ${known.join(", ")}`}`,
  );
  error.helpFor = parent;
  return error;
}
