const maxBytes = 2048;

/** A Python traceback's header, and the lines that chain one exception to the next. */
const tracebackStart = /^\s*Traceback \(most recent call last\):\s*$/;
const chained =
  /^\s*(During handling of the above exception|The above exception was the direct cause)/;
/** A JavaScript stack frame (`    at f (file:1:2)`) or its elision (`    ... 3 more`). */
const jsFrame = /^\s+(at\s|\.\.\. \d+ (more|lines))/;

/**
 * The lines of a worker's message that say what went wrong, without the
 * stack between them: a Python traceback keeps its exception line
 * (`ValueError: bad input at row 7`, the one unindented line after the
 * frames; each one of a chain), a JavaScript stack keeps `Error: …`, and
 * text around them is kept as it is.
 */
function withoutFrames(message: string): string[] {
  const kept: string[] = [];
  let inTraceback = false;
  for (const line of message.split(/\r?\n/)) {
    if (tracebackStart.test(line)) {
      inTraceback = true;
      continue;
    }
    if (chained.test(line) || jsFrame.test(line)) continue;
    // Inside a traceback every indented line is a frame (`  File "…", line 3`),
    // its source line or its caret marks; the first unindented one is the exception.
    if (inTraceback && /^\s/.test(line)) continue;
    inTraceback = false;
    kept.push(line);
  }
  return kept;
}

/**
 * Makes a worker's error message safe to store and show, and keeps what it
 * means: drops traceback frames (Python or JavaScript) but keeps the
 * exception line, masks bearer tokens, long secrets and absolute paths,
 * folds whitespace, and cuts it to 2 KiB. Every path that stores a
 * worker's message (FailTask, the REST adapters, `meshwork work`, the SDK)
 * goes through FailTask, and so through here.
 */
export function sanitizeMessage(message: string): string {
  const s = withoutFrames(message)
    .join("\n")
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
