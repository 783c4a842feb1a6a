import { bytesOf, saveTo, streamOf } from "./input.js";
import type { Running, Session } from "./session.js";
import type { NamedInput } from "./types.js";

// The outputs of a task's dependencies as named inputs (`ctx.inputs`).

/**
 * The named inputs of a claimed task: one per entry of its
 * `dependency_outputs` (`<ref or task id>/<name>` → artifact id), each
 * downloaded only when asked, under the task's lease, and checked against
 * the SHA-256 of its artifact's metadata.
 */
export function namedInputs(s: Session, entry: Running): Readonly<Record<string, NamedInput>> {
  const inputs: Record<string, NamedInput> = {};
  for (const [name, artifactId] of Object.entries(entry.claim.dependencyOutputs)) {
    const source = { artifactId, sha256: "", what: `input ${JSON.stringify(name)}` };
    inputs[name] = {
      name,
      artifactId,
      bytes: () => bytesOf(s, entry, source),
      save: (path) => saveTo(s, entry, source, path),
      stream: () => streamOf(s, entry, source),
    };
  }
  return Object.freeze(inputs);
}
