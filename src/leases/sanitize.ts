const maxBytes = 2048;

/**
 * Makes a worker's error message safe to store and show: drops a traceback
 * (Python or JavaScript stack), masks bearer tokens, long secrets and
 * absolute paths, folds whitespace, and cuts it to 2 KiB.
 */
export function sanitizeMessage(message: string): string {
  let s = message;
  const traceback = s.search(/Traceback \(most recent call last\)|\n\s+at\s|\n\s+File "/);
  if (traceback >= 0) s = s.slice(0, traceback);
  s = s
    .replace(/\b(bearer|token|password|secret|api[_-]?key)(\s*[:=]\s*|\s+)\S+/gi, "$1$2[redacted]")
    .replace(/\b[A-Za-z0-9+/_-]{32,}={0,2}/g, "[redacted]")
    .replace(/(^|[\s"'(=:])(?:[A-Za-z]:\\|\/(?!\/))(?:[^\s"'()]+)/g, "$1[path]")
    .replace(/\s+/g, " ")
    .trim();
  const bytes = Buffer.from(s, "utf8");
  if (bytes.length <= maxBytes) return s;
  // Cut on a character boundary.
  return `${bytes
    .subarray(0, maxBytes - 3)
    .toString("utf8")
    .replace(/\uFFFD$/, "")}...`;
}
