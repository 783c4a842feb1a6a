import { createInterface } from "node:readline";
import type { Readable, Writable } from "node:stream";
import { fromJson, toJsonString } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import {
  type KnowledgeEntry,
  KnowledgeEntrySchema,
  KnowledgeService,
} from "../../gen/meshwork/v1/knowledge_pb.js";
import { endpointOf, parse, runCommand, stdio, UsageError } from "./args.js";
import { type Endpoint, resolveToken, transportFor } from "./connect.js";
import { unknownSubcommand } from "./suggest.js";

const batch = 500;

function client(endpoint: Endpoint) {
  return createClient(KnowledgeService, transportFor(endpoint));
}

export interface Counts {
  inserted: number;
  updated: number;
  unchanged: number;
  rejected: number;
  /** Why entries were rejected ("line 3 (pattern/p1): origin must not be empty"), the first 100. */
  reasons: string[];
}

const maxReasons = 100;

/** Writes every entry (of `kind`, changed after `since`) as one JSON line each. */
export async function exportKnowledge(
  url: Endpoint,
  out: Writable,
  filter: { kind?: string; since?: Date } = {},
): Promise<number> {
  let n = 0;
  const stream = client(url).exportKnowledge({
    kind: filter.kind ?? "",
    since: filter.since ? timestampFromDate(filter.since) : undefined,
  });
  for await (const res of stream) {
    for (const e of res.entries) {
      out.write(`${toJsonString(KnowledgeEntrySchema, e)}\n`);
      n++;
    }
  }
  return n;
}

/** Entries to import, each with where it came from ("line 3", "entry 7") for rejections. */
async function importBatches(
  url: Endpoint,
  entries: AsyncIterable<{ entry: KnowledgeEntry; from: string }>,
  total: Counts = { inserted: 0, updated: 0, unchanged: 0, rejected: 0, reasons: [] },
): Promise<Counts> {
  const c = client(url);
  let pending: { entry: KnowledgeEntry; from: string }[] = [];
  const flush = async () => {
    if (pending.length === 0) return;
    const res = await c.importKnowledge({ entries: pending.map((p) => p.entry) });
    total.inserted += Number(res.inserted);
    total.updated += Number(res.updated);
    total.unchanged += Number(res.unchanged);
    total.rejected += Number(res.rejected);
    for (const r of res.rejections) {
      if (total.reasons.length >= maxReasons) break;
      total.reasons.push(`${pending[r.index]?.from} (${r.kind}/${r.key}): ${r.reason}`);
    }
    pending = [];
  };
  for await (const e of entries) {
    pending.push(e);
    if (pending.length >= batch) await flush();
  }
  await flush();
  return total;
}

/** Reads JSON lines (as `export` writes them) and merges them into the coordinator at `url`. */
export async function importKnowledge(url: Endpoint, input: Readable): Promise<Counts> {
  const total: Counts = { inserted: 0, updated: 0, unchanged: 0, rejected: 0, reasons: [] };
  async function* entries() {
    let n = 0;
    for await (const line of createInterface({ input })) {
      n++;
      if (line.trim() === "") continue;
      try {
        yield { entry: fromJson(KnowledgeEntrySchema, JSON.parse(line)), from: `line ${n}` };
      } catch {
        total.rejected++;
        if (total.reasons.length < maxReasons) {
          total.reasons.push(`line ${n}: not a knowledge entry in JSON`);
        }
      }
    }
  }
  return importBatches(url, entries(), total);
}

/** One-way sync: everything `from` has is merged into `to` (idempotent). */
export async function syncKnowledge(from: Endpoint, to: Endpoint): Promise<Counts> {
  async function* entries() {
    let n = 0;
    for await (const res of client(from).exportKnowledge({})) {
      for (const entry of res.entries) yield { entry, from: `entry ${++n}` };
    }
  }
  return importBatches(to, entries());
}

const usage = `Usage:
  meshwork knowledge export [--url URL] [--token T] [--kind K] [--since RFC3339] > entries.jsonl
  meshwork knowledge import [--url URL] [--token T] < entries.jsonl
  meshwork knowledge sync --from URL [--from-token T] --to URL [--to-token T]

URL defaults to $MESHWORK_URL or http://127.0.0.1:8080. The token (a client
or admin token) defaults to $MESHWORK_TOKEN, else <data dir>/admin.token of
the local data dir (--data-dir, $MESHWORK_DATA_DIR or ./.meshwork).
`;

/** `meshwork knowledge …`; returns the exit code. */
export async function knowledgeCommand(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === "--help" || sub === "-h" || rest.includes("--help") || rest.includes("-h")) {
    process.stdout.write(usage);
    return 0;
  }
  return runCommand(`meshwork knowledge ${sub ?? ""}`.trimEnd(), stdio, () => run(sub, rest));
}

async function run(sub: string | undefined, rest: string[]): Promise<number> {
  const { values } = parse(rest, {
    url: { type: "string" },
    kind: { type: "string" },
    since: { type: "string" },
    from: { type: "string" },
    to: { type: "string" },
    token: { type: "string" },
    "from-token": { type: "string" },
    "to-token": { type: "string" },
    "data-dir": { type: "string" },
  });
  const token = resolveToken(values.token, values["data-dir"]);
  const url: Endpoint = { url: endpointOf({ url: values.url, token }).url, token };
  const report = (c: Counts) => {
    for (const reason of c.reasons) process.stderr.write(`rejected ${reason}\n`);
    process.stderr.write(
      `inserted ${c.inserted}, updated ${c.updated}, unchanged ${c.unchanged}, rejected ${c.rejected}\n`,
    );
    // Every line rejected is a failed import, not a done one.
    return c.rejected > 0 && c.inserted + c.updated + c.unchanged === 0 ? 1 : 0;
  };
  switch (sub) {
    case "export": {
      const since = values.since ? new Date(values.since) : undefined;
      if (since && Number.isNaN(since.getTime()))
        throw new UsageError(
          `--since must be an RFC 3339 time, not ${JSON.stringify(values.since)}`,
        );
      const n = await exportKnowledge(url, process.stdout, { kind: values.kind, since });
      process.stderr.write(`exported ${n} entries\n`);
      return 0;
    }
    case "import":
      return report(await importKnowledge(url, process.stdin));
    case "sync":
      if (!values.from || !values.to) throw new UsageError("sync needs --from URL and --to URL");
      return report(
        await syncKnowledge(
          { url: values.from, token: values["from-token"] ?? token },
          { url: values.to, token: values["to-token"] ?? token },
        ),
      );
    case undefined:
      process.stderr.write(usage);
      return 2;
    default:
      throw unknownSubcommand(sub, ["export", "import", "sync"], "meshwork knowledge");
  }
}
