import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  ConcurrencyService,
  ListLimitsResponseSchema,
  ListRatesResponseSchema,
} from "../../gen/meshwork/v1/concurrency_pb.js";
import { ListSharesResponseSchema, ShareService } from "../../gen/meshwork/v1/share_pb.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  intFlag,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { transportFor } from "./connect.js";
import { unknownSubcommand } from "./suggest.js";
import { ago, table } from "./table.js";

const usage = {
  share: `Usage:
  meshwork share list
  meshwork share set PATH WEIGHT
  meshwork share delete PATH

Shares split the fleet among teams (ShareService, docs/scheduling.md). A
task is charged to a share path (lab/team-a/alice); siblings split their
parent's part by weight (default 1), among those with work. 'list' shows
each node's weight, entitlement, usage (decayed) and allocation (now) as
percentages of the fleet, and its running and pending tasks. 'set' and
'delete' take an admin token.

${endpointHelp}`,
  limit: `Usage:
  meshwork limit list
  meshwork limit set KEY MAX_RUNNING
  meshwork limit delete KEY

A concurrency limit (ConcurrencyService): at most MAX_RUNNING tasks with
concurrency_key KEY hold leases at once (a licence server's seats, a
customer's quota). 'set' and 'delete' take an admin token.

${endpointHelp}`,
  rate: `Usage:
  meshwork rate list
  meshwork rate set KEY PER_SECOND [--burst N]
  meshwork rate delete KEY

A rate (ConcurrencyService): leases of tasks with rate_key KEY are granted
at most PER_SECOND a second, with bursts of up to --burst (default:
PER_SECOND rounded up). 'set' and 'delete' take an admin token.

${endpointHelp}`,
};

const pct = (f: number) => `${(f * 100).toFixed(1)}%`;

/** `meshwork share|limit|rate …`; returns the exit code. */

/** Every page of a listing, merged into the first page's response (its next_page_token then empty). */
async function wholeList<R extends { nextPageToken: string }>(
  read: (pageToken: string) => Promise<R>,
  merge: (all: R, page: R) => void,
): Promise<R> {
  const all = await read("");
  for (let next = all.nextPageToken; next; ) {
    const page = await read(next);
    merge(all, page);
    next = page.nextPageToken;
  }
  all.nextPageToken = "";
  return all;
}

export async function schedulingCommand(
  command: "share" | "limit" | "rate",
  argv: string[],
  io: Io = stdio,
): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage[command]);
    return sub === undefined ? 2 : 0;
  }
  return runCommand(`meshwork ${command} ${sub}`, io, async () => {
    if (!["list", "set", "delete"].includes(sub)) {
      throw unknownSubcommand(sub, ["list", "set", "delete"], `meshwork ${command}`);
    }
    const { values, positionals } = parse(rest, {
      ...endpointOptions,
      ...(command === "rate" && sub === "set" ? { burst: { type: "string" } } : {}),
    } as typeof endpointOptions & { burst: { type: "string" } });
    if (values.help) {
      io.out.write(usage[command]);
      return 0;
    }
    const transport = transportFor(endpointOf(values));
    const names =
      sub === "list"
        ? []
        : sub === "delete"
          ? [command === "share" ? "PATH" : "KEY"]
          : command === "share"
            ? ["PATH", "WEIGHT"]
            : ["KEY", command === "limit" ? "MAX_RUNNING" : "PER_SECOND"];
    const [key = "", amount = ""] = positionalsOf(positionals, names);
    const number = (text: string, what: string) => {
      const n = Number(text);
      if (text === "" || !Number.isFinite(n)) {
        throw new UsageError(`${what} must be a number, not ${JSON.stringify(text)}`);
      }
      return n;
    };
    if (command === "share") {
      const shares = createClient(ShareService, transport);
      if (sub === "set") await shares.setShare({ path: key, weight: number(amount, "WEIGHT") });
      if (sub === "delete") {
        const { deleted } = await shares.deleteShare({ path: key });
        io.out.write(
          deleted ? `share ${key} is back to weight 1\n` : `share ${key} had no weight set\n`,
        );
        return 0;
      }
      const res = await wholeList(
        (pageToken) => shares.listShares({ pageSize: 1000, pageToken }),
        (all, page) => all.shares.push(...page.shares),
      );
      if (values.json) {
        io.out.write(`${JSON.stringify(toJson(ListSharesResponseSchema, res))}\n`);
        return 0;
      }
      io.out.write(
        res.shares.length === 0
          ? "SHARES  none\n"
          : table(
              ["SHARE", "WEIGHT", "ENTITLED", "USAGE", "NOW", "RUNNING", "PENDING"],
              res.shares.map((s) => [
                `${"  ".repeat(s.path.split("/").length - 1)}${s.path}`,
                String(s.weight),
                pct(s.entitlement),
                pct(s.usage),
                pct(s.allocation),
                String(s.running),
                String(s.pending),
              ]),
            ),
      );
      return 0;
    }
    const limits = createClient(ConcurrencyService, transport);
    if (command === "limit") {
      if (sub === "set") {
        await limits.setLimit({
          key,
          maxRunning: intFlag("MAX_RUNNING", amount, 0, 1_000_000) ?? 0,
        });
      }
      if (sub === "delete") {
        const { deleted } = await limits.deleteLimit({ key });
        io.out.write(deleted ? `limit ${key} removed\n` : `key ${key} had no limit\n`);
        return 0;
      }
      const res = await wholeList(
        (pageToken) => limits.listLimits({ pageSize: 1000, pageToken }),
        (all, page) => all.limits.push(...page.limits),
      );
      if (values.json) {
        io.out.write(`${JSON.stringify(toJson(ListLimitsResponseSchema, res))}\n`);
        return 0;
      }
      io.out.write(
        res.limits.length === 0
          ? "LIMITS  none\n"
          : table(
              ["KEY", "RUNNING", "MAX", "PENDING"],
              res.limits.map((l) => [
                l.key,
                String(l.running),
                String(l.maxRunning),
                String(l.pending),
              ]),
            ),
      );
      return 0;
    }
    if (sub === "set") {
      const v = values as typeof values & { burst?: string };
      await limits.setRate({
        key,
        perSecond: number(amount, "PER_SECOND"),
        burst: intFlag("burst", v.burst, 1, 1_000_000),
      });
    }
    if (sub === "delete") {
      const { deleted } = await limits.deleteRate({ key });
      io.out.write(deleted ? `rate ${key} removed\n` : `key ${key} had no rate\n`);
      return 0;
    }
    const res = await wholeList(
      (pageToken) => limits.listRates({ pageSize: 1000, pageToken }),
      (all, page) => all.rates.push(...page.rates),
    );
    if (values.json) {
      io.out.write(`${JSON.stringify(toJson(ListRatesResponseSchema, res))}\n`);
      return 0;
    }
    io.out.write(
      res.rates.length === 0
        ? "RATES  none\n"
        : table(
            ["KEY", "PER SECOND", "BURST", "TOKENS", "LAST TAKEN"],
            res.rates.map((r) => [
              r.key,
              String(r.perSecond),
              String(r.burst),
              r.tokens.toFixed(2),
              ago(r.updatedAt),
            ]),
          ),
    );
    return 0;
  });
}
