import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { inject } from "vitest";
import { until } from "./bounded.js";

/** A loopback port free when asked. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** `node bin/meshwork.js serve ARGS` as a child process, its stdout and stderr gathered. */
export function spawnServe(
  args: string[],
  env: NodeJS.ProcessEnv,
): { child: ChildProcess; output: () => string; exited: Promise<number | null> } {
  if (!inject("distBuilt")) {
    throw new Error(
      "bin/meshwork.js runs dist/, which this run did not build: import support/serve.js " +
        'with a static path, so that vitest.config.ts puts this file in the "built" project',
    );
  }
  const child = spawn("node", ["bin/meshwork.js", "serve", ...args], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout?.on("data", (d: Buffer) => {
    output += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    output += d.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, output: () => output, exited };
}

/** Waits until GET `url`/readyz answers 200 (a refused connection is "not yet"), at most `ms`. */
export function untilReady(url: string, ms: number): Promise<void> {
  return until(
    () =>
      fetch(`${url}/readyz`).then(
        (r) => r.status === 200,
        () => false,
      ),
    ms,
  );
}
