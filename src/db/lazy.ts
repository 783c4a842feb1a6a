/**
 * Builds a prepared statement on first use and keeps it: building a Drizzle
 * query costs more than running it (measured on the claim: ~5×), and a
 * store made for one transaction never builds what it does not run.
 */
export function lazy<T>(build: () => T): () => T {
  let built: T | undefined;
  return () => {
    built ??= build();
    return built;
  };
}
