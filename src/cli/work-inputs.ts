import { mkdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import type { JsonObject } from "@bufbuild/protobuf";
import { type TaskContext, TaskError } from "../sdk/worker.js";

// What `meshwork work` adds around a command for workflows: its
// dependencies' outputs as files ($MESHWORK_INPUTS_DIR) and the result
// value it may write ($MESHWORK_RESULT_VALUE).

/** The most a result value may take, as JSON text (CompleteTaskRequest.result_value). */
const maxResultValueBytes = 64 * 1024;

/** A part of an input's name that is safe as one path segment. */
function safeSegment(part: string | undefined): part is string {
  return (
    part !== undefined && part !== "" && part !== "." && part !== ".." && !/[/\\\0]/.test(part)
  );
}

/**
 * Downloads each of the task's named inputs (its dependencies' outputs)
 * into `dir/<ref or task id>/<filename>`, checked against their SHA-256,
 * streamed to disk. A name that is not two safe path segments fails the
 * task (UnsafeInputName) rather than write outside `dir`.
 */
export async function saveNamedInputs(ctx: TaskContext, dir: string): Promise<void> {
  await mkdir(dir);
  for (const [name, input] of Object.entries(ctx.inputs)) {
    const [owner, file, ...rest] = name.split("/");
    if (rest.length > 0 || !safeSegment(owner) || !safeSegment(file)) {
      throw new TaskError("UnsafeInputName", `input name ${JSON.stringify(name)} is not a path`, {
        retryable: false,
      });
    }
    await mkdir(join(dir, owner), { recursive: true });
    await input.save(join(dir, owner, file));
  }
}

/**
 * The JSON object the command wrote to `path` (undefined when it wrote
 * nothing there), or a TaskError not retried: ResultValueInvalid when it is
 * not a JSON object, ResultValueTooLarge past 64 KiB.
 */
export async function resultValueAt(path: string): Promise<JsonObject | undefined> {
  const info = await stat(path).catch(() => undefined);
  if (!info) return undefined;
  const tooLarge = (bytes: number) =>
    new TaskError(
      "ResultValueTooLarge",
      `$MESHWORK_RESULT_VALUE holds ${bytes} bytes, over the ${maxResultValueBytes} allowed`,
      { retryable: false },
    );
  if (!info.isFile()) {
    throw new TaskError("ResultValueInvalid", "$MESHWORK_RESULT_VALUE is not a regular file", {
      retryable: false,
    });
  }
  if (info.size > maxResultValueBytes) throw tooLarge(info.size);
  const text = await readFile(path, "utf8");
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new TaskError(
      "ResultValueInvalid",
      `$MESHWORK_RESULT_VALUE is not valid JSON: ${(error as Error).message}`,
      { retryable: false },
    );
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new TaskError(
      "ResultValueInvalid",
      "$MESHWORK_RESULT_VALUE holds JSON but not an object",
      {
        retryable: false,
      },
    );
  }
  return value as JsonObject;
}
