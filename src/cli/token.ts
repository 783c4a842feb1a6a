import { toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  type Token,
  TokenRole,
  TokenSchema,
  TokenService,
} from "../../gen/meshwork/v1/token_pb.js";
import { isUuid } from "../core/validate.js";
import {
  endpointHelp,
  endpointOf,
  endpointOptions,
  type Io,
  parse,
  positionalsOf,
  runCommand,
  stdio,
  UsageError,
} from "./args.js";
import { transportFor } from "./connect.js";
import { unknownSubcommand } from "./suggest.js";
import { ago, table } from "./table.js";

const usage = `Usage:
  meshwork token create --role admin|client|worker --name NAME
  meshwork token list
  meshwork token revoke NAME|ID

Every token command needs an admin token.
'create' prints the new token alone on stdout (details on stderr): it is shown
  this once. With --json, one object: the token's fields and its secret.
'list' never prints a secret; --json prints {"tokens": [...]}.
'revoke' revokes it at once: its calls are refused within half a second and
  its open streams end within a second, on every replica.

${endpointHelp}`;

const roleOf: Record<string, TokenRole> = {
  admin: TokenRole.ADMIN,
  client: TokenRole.CLIENT,
  worker: TokenRole.WORKER,
};

const roleName = (r: TokenRole) => (TokenRole[r] ?? String(r)).toLowerCase();
const tokenJson = (t: Token) => toJson(TokenSchema, t);

/** `meshwork token …`; returns the exit code. */
export async function tokenCommand(argv: string[], io: Io = stdio): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    (sub === undefined ? io.err : io.out).write(usage);
    return sub === undefined ? 2 : 0;
  }
  const prefix = `meshwork token ${sub}`;
  return runCommand(prefix, io, async () => {
    const { values, positionals } = parse(rest, {
      ...endpointOptions,
      role: { type: "string" },
      name: { type: "string" },
    });
    if (values.help) {
      io.out.write(usage);
      return 0;
    }
    const only = (flags: ("role" | "name")[]) => {
      for (const f of ["role", "name"] as const) {
        if (values[f] !== undefined && !flags.includes(f))
          throw new UsageError(`unknown flag --${f}`);
      }
    };
    const tokens = () => createClient(TokenService, transportFor(endpointOf(values)));
    switch (sub) {
      case "create": {
        only(["role", "name"]);
        positionalsOf(positionals, []);
        const role = roleOf[(values.role ?? "").toLowerCase()];
        if (role === undefined) {
          throw new UsageError(
            values.role === undefined
              ? "missing --role (admin, client or worker)"
              : `--role must be admin, client or worker, not ${JSON.stringify(values.role)}`,
          );
        }
        if (!values.name) throw new UsageError("missing --name");
        const res = await tokens().createToken({ name: values.name, role });
        const t = res.token;
        if (!t) throw new Error("the coordinator answered without the token");
        if (values.json) {
          io.out.write(`${JSON.stringify({ token: tokenJson(t), secret: res.secret })}\n`);
        } else {
          io.out.write(`${res.secret}\n`);
          io.err.write(
            `created ${roleName(t.role)} token ${t.name} (${t.tokenId}); it is shown only now\n`,
          );
        }
        return 0;
      }
      case "list": {
        only([]);
        positionalsOf(positionals, []);
        let pageToken = "";
        const rows: Token[] = [];
        for (let page = 0; page < 1000; page++) {
          const res = await tokens().listTokens({ pageToken, pageSize: 1000 });
          rows.push(...res.tokens);
          pageToken = res.nextPageToken;
          if (pageToken === "") break;
        }
        if (values.json) {
          io.out.write(`${JSON.stringify({ tokens: rows.map(tokenJson) })}\n`);
          return 0;
        }
        io.out.write(
          table(
            ["ID", "ROLE", "NAME", "CREATED", "LAST USED", "REVOKED"],
            rows.map((t) => [
              t.tokenId,
              roleName(t.role),
              t.name,
              ago(t.createdAt),
              t.lastUsedAt ? ago(t.lastUsedAt) : "-",
              t.revokedAt ? ago(t.revokedAt) : "-",
            ]),
          ),
        );
        return 0;
      }
      case "revoke": {
        only([]);
        const [which = ""] = positionalsOf(positionals, ["NAME|ID"]);
        const res = await tokens().revokeToken({ tokenId: "", name: "", ...pick(which) });
        if (values.json)
          io.out.write(`${JSON.stringify({ token: res.token && tokenJson(res.token) })}\n`);
        else io.out.write(`revoked token ${res.token?.name} (${res.token?.tokenId})\n`);
        return 0;
      }
      default:
        throw unknownSubcommand(sub, ["create", "list", "revoke"]);
    }
  });
}

/** A UUID names a token by id, anything else by name. */
function pick(which: string): { tokenId: string } | { name: string } {
  return isUuid(which) ? { tokenId: which } : { name: which };
}
