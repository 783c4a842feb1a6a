import { parseArgs } from "node:util";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { type Token, TokenRole, TokenService } from "../../gen/meshwork/v1/token_pb.js";
import { defaultUrl, resolveToken, transportFor } from "./connect.js";

const usage = `Usage:
  meshwork token create --role admin|client|worker --name NAME [--json]
  meshwork token list [--json]
  meshwork token revoke NAME|ID

Common flags:
  --url URL        the coordinator; default $MESHWORK_URL or http://127.0.0.1:8080
  --token T        an admin token; default $MESHWORK_TOKEN, else <data dir>/admin.token
  --data-dir DIR   the local data dir holding admin.token; default $MESHWORK_DATA_DIR or ./.meshwork

'create' prints the new token alone on stdout (details on stderr): it is shown
this once. 'list' never prints a secret.
`;

const roleOf: Record<string, TokenRole> = {
  admin: TokenRole.ADMIN,
  client: TokenRole.CLIENT,
  worker: TokenRole.WORKER,
};

const roleName = (r: TokenRole) => TokenRole[r].toLowerCase();
const time = (t: Token["createdAt"]) => (t ? timestampDate(t).toISOString() : "");

function describe(t: Token) {
  return {
    token_id: t.tokenId,
    name: t.name,
    role: roleName(t.role),
    created_at: time(t.createdAt),
    last_used_at: time(t.lastUsedAt) || null,
    revoked_at: time(t.revokedAt) || null,
  };
}

/** `meshwork token …`; returns the exit code. */
export async function tokenCommand(
  argv: string[],
  out: NodeJS.WritableStream = process.stdout,
  err: NodeJS.WritableStream = process.stderr,
): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    out.write(usage);
    return sub === undefined ? 2 : 0;
  }
  const { values, positionals } = parseArgs({
    args: rest,
    options: {
      url: { type: "string" },
      token: { type: "string" },
      "data-dir": { type: "string" },
      role: { type: "string" },
      name: { type: "string" },
      json: { type: "boolean" },
    },
    allowPositionals: true,
    strict: true,
  });
  const endpoint = {
    url: values.url ?? defaultUrl(),
    token: resolveToken(values.token, values["data-dir"]),
  };
  if (endpoint.token === "") {
    err.write(
      "meshwork token: no admin token: pass --token, set MESHWORK_TOKEN, or run where <data dir>/admin.token is\n",
    );
    return 2;
  }
  const tokens = createClient(TokenService, transportFor(endpoint));
  try {
    switch (sub) {
      case "create": {
        const role = roleOf[values.role ?? ""];
        if (role === undefined || !values.name) {
          err.write(usage);
          return 2;
        }
        const res = await tokens.createToken({ name: values.name, role });
        const t = res.token;
        if (!t) throw new Error("the coordinator answered without the token");
        if (values.json) {
          out.write(`${JSON.stringify({ ...describe(t), token: res.secret })}\n`);
        } else {
          out.write(`${res.secret}\n`);
          err.write(
            `created ${roleName(t.role)} token ${t.name} (${t.tokenId}); it is shown only now\n`,
          );
        }
        return 0;
      }
      case "list": {
        let pageToken = "";
        const rows: ReturnType<typeof describe>[] = [];
        for (let page = 0; page < 1000; page++) {
          const res = await tokens.listTokens({ pageToken, pageSize: 1000 });
          rows.push(...res.tokens.map(describe));
          pageToken = res.nextPageToken;
          if (pageToken === "") break;
        }
        if (values.json) {
          for (const r of rows) out.write(`${JSON.stringify(r)}\n`);
        } else {
          out.write(
            "ID                                    ROLE    NAME  CREATED  LAST USED  REVOKED\n",
          );
          for (const r of rows) {
            out.write(
              `${r.token_id}  ${r.role.padEnd(6)}  ${r.name}  ${r.created_at}  ${r.last_used_at ?? "-"}  ${r.revoked_at ?? "-"}\n`,
            );
          }
        }
        return 0;
      }
      case "revoke": {
        const [which] = positionals;
        if (!which || positionals.length > 1) {
          err.write(usage);
          return 2;
        }
        const res = await tokens.revokeToken({ tokenId: "", name: "", ...pick(which) });
        err.write(`revoked token ${res.token?.name} (${res.token?.tokenId})\n`);
        return 0;
      }
      default:
        err.write(usage);
        return 2;
    }
  } catch (error) {
    const e = ConnectError.from(error);
    err.write(`meshwork token ${sub}: ${Code[e.code]}: ${e.rawMessage}\n`);
    return 1;
  }
}

/** A UUID names a token by id, anything else by name. */
function pick(which: string): { tokenId: string } | { name: string } {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(which)
    ? { tokenId: which }
    : { name: which };
}
