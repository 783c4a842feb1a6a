import { Writable } from "node:stream";

/** A stream that keeps everything written to it as text (a logger's lines, a command's output). */
export function textSink(): { stream: Writable; text(): string } {
  let text = "";
  const stream = new Writable({
    write(chunk, _enc, done) {
      text += String(chunk);
      done();
    },
  });
  return { stream, text: () => text };
}
