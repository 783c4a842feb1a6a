import { type ParseArgsConfig, parseArgs } from "node:util";
import type { JsonObject } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { checkedUrl } from "../sdk/rpc.js";
import { defaultUrl, type Endpoint, resolveToken } from "./connect.js";

/** A mistake in the command line: one line on stderr, exit code 2. */
export class UsageError extends Error {
  /** The command whose --help to point at, when not the one that failed (an unknown subcommand). */
  helpFor = "";
}

/** Where a command writes: stdout for results, stderr for everything else. */
export interface Io {
  out: NodeJS.WritableStream;
  err: NodeJS.WritableStream;
}

export const stdio: Io = { out: process.stdout, err: process.stderr };

type Options = NonNullable<ParseArgsConfig["options"]>;

/** What `parse` returns for `options` (named, so that declarations can be emitted). */
export type Parsed<T extends Options> = ReturnType<
  typeof parseArgs<{ args: string[]; options: T; allowPositionals: true; strict: true }>
>;

/** The flags every operator command takes. */
export const endpointOptions = {
  url: { type: "string" },
  token: { type: "string" },
  "data-dir": { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const satisfies Options;

export const endpointHelp = `Common flags:
  --url URL        the coordinator; default $MESHWORK_URL or http://127.0.0.1:8080
  --token T        a bearer token; default $MESHWORK_TOKEN, else <data dir>/admin.token
  --data-dir DIR   the local data dir holding admin.token; default $MESHWORK_DATA_DIR or ./.meshwork
  --json           print proto JSON instead of a table
  -h, --help       this help

Exit codes: 0 done, 1 the coordinator refused or could not be reached, 2 bad command line.
`;

/**
 * node:util.parseArgs in strict mode, with its errors turned into one
 * UsageError line that names the flag ("unknown flag --fast").
 */
export function parse<T extends Options>(args: string[], options: T): Parsed<T> {
  // A negative number after a flag that takes a value is its value
  // (`--limit -1`), for the range check to refuse with a clear line.
  const joined: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i] ?? "";
    const next = args[i + 1];
    const name = a.startsWith("--") ? a.slice(2) : "";
    if (next !== undefined && /^-\d/.test(next) && options[name]?.type === "string") {
      joined.push(`${a}=${next}`);
      i++;
    } else joined.push(a);
  }
  try {
    return parseArgs({ args: joined, options, allowPositionals: true, strict: true });
  } catch (error) {
    const e = error as Error & { code?: string };
    const flag = /'(-{1,2}[^' ]+)/.exec(e.message)?.[1] ?? "";
    if (e.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") throw new UsageError(`unknown flag ${flag}`);
    if (e.code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") {
      throw new UsageError(
        /argument missing/.test(e.message) ? `${flag} needs a value` : `${flag} takes no value`,
      );
    }
    throw new UsageError(e.message.split("\n")[0] ?? "bad arguments");
  }
}

/** The coordinator and token named by --url/--token/--data-dir or their defaults. */
export function endpointOf(values: {
  url?: string | undefined;
  token?: string | undefined;
  "data-dir"?: string | undefined;
}): Endpoint {
  const url = values.url ?? defaultUrl();
  try {
    checkedUrl(url, values.url === undefined ? "$MESHWORK_URL" : "--url");
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  return { url, token: resolveToken(values.token, values["data-dir"]) };
}

/** An integer flag in [min, max], or undefined when absent. */
export function intFlag(
  name: string,
  value: string | undefined,
  min: number,
  max: number,
): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!/^-?\d+$/.test(value) || n < min || n > max) {
    throw new UsageError(
      `--${name} must be an integer from ${min} to ${max}, not ${JSON.stringify(value)}`,
    );
  }
  return n;
}

/** Exactly `n` positionals, else a UsageError naming what is expected. */
export function positionalsOf(positionals: string[], names: string[]): string[] {
  if (positionals.length < names.length) {
    throw new UsageError(`missing ${names.slice(positionals.length).join(" ")}`);
  }
  if (positionals.length > names.length) {
    throw new UsageError(`unexpected argument ${JSON.stringify(positionals[names.length])}`);
  }
  return positionals;
}

/**
 * Runs one subcommand and maps failures to exit codes: a UsageError is one
 * line and 2; a refusal by the coordinator is one line and 1. A token is
 * never echoed: messages come from the coordinator or from this file.
 */
export async function runCommand(
  prefix: string,
  io: Io,
  body: () => Promise<number>,
  options: { unauthenticatedHint?: string } = {},
): Promise<number> {
  try {
    return await body();
  } catch (error) {
    if (error instanceof UsageError) {
      const helpFor = error.helpFor || prefix;
      io.err.write(`${prefix}: ${error.message} (see '${helpFor} --help')\n`);
      return 2;
    }
    if (error instanceof ConnectError) {
      const hint =
        error.code === Code.Unauthenticated
          ? ` (${options.unauthenticatedHint ?? "check --token, $MESHWORK_TOKEN or <data dir>/admin.token"})`
          : "";
      io.err.write(`${prefix}: ${codeToString(error.code)}: ${error.rawMessage}${hint}\n`);
      return 1;
    }
    io.err.write(`${prefix}: ${(error as Error).message}\n`);
    return 1;
  }
}

/** `--params JSON` merged with each `--param K=V` (V as JSON when it parses). */
export function parameterObject(
  params: string | undefined,
  each: string[],
): JsonObject | undefined {
  let obj: JsonObject = {};
  if (params !== undefined) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(params);
    } catch {
      throw new UsageError("--params must be a JSON object");
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new UsageError("--params must be a JSON object");
    }
    obj = parsed as JsonObject;
  }
  for (const [k, v] of Object.entries(pairs("param", each))) {
    try {
      obj[k] = JSON.parse(v);
    } catch {
      obj[k] = v;
    }
  }
  return params === undefined && each.length === 0 ? undefined : obj;
}

/** `K=V` flags as an object; a flag without `=` or with an empty key is a UsageError. */
export function pairs(flag: string, each: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of each) {
    const i = p.indexOf("=");
    if (i <= 0) throw new UsageError(`--${flag} must be KEY=VALUE, not ${JSON.stringify(p)}`);
    out[p.slice(0, i)] = p.slice(i + 1);
  }
  return out;
}
