import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  type Token,
  TokenRole,
  TokenSchema,
  type TokenService,
} from "../../gen/meshwork/v1/token_pb.js";
import { invalid } from "../core/errors.js";
import { decodeCursor, pageSize } from "../core/paging.js";
import { uuidField } from "../core/validate.js";
import type { TokenRoleName, TokenRow } from "../db/schema/index.js";
import { callerOf } from "./principal.js";
import type { TokenStore } from "./token-store.js";

const roleNames: Partial<Record<TokenRole, TokenRoleName>> = {
  [TokenRole.ADMIN]: "admin",
  [TokenRole.CLIENT]: "client",
  [TokenRole.WORKER]: "worker",
};

const roles: Record<TokenRoleName, TokenRole> = {
  admin: TokenRole.ADMIN,
  client: TokenRole.CLIENT,
  worker: TokenRole.WORKER,
};

export function toToken(row: TokenRow): Token {
  return create(TokenSchema, {
    tokenId: row.id,
    name: row.name,
    role: roles[row.role],
    createdAt: timestampFromDate(row.createdAt),
    lastUsedAt: row.lastUsedAt ? timestampFromDate(row.lastUsedAt) : undefined,
    revokedAt: row.revokedAt ? timestampFromDate(row.revokedAt) : undefined,
  });
}

/** TokenService: make, list and revoke bearer tokens (the auth interceptor lets only admin in). */
export function createTokenService(app: {
  tokens: Pick<TokenStore, "create" | "list" | "revoke">;
}): ServiceImpl<typeof TokenService> {
  return {
    async createToken(req) {
      const role = roleNames[req.role];
      if (!role)
        throw invalid("role must be TOKEN_ROLE_ADMIN, TOKEN_ROLE_CLIENT or TOKEN_ROLE_WORKER");
      const { row, secret } = await app.tokens.create(req.name, role);
      return { token: toToken(row), secret };
    },

    async whoAmI(_req, ctx) {
      const p = callerOf(ctx.values);
      return {
        token: create(TokenSchema, { tokenId: p.tokenId ?? "", name: p.name, role: roles[p.role] }),
      };
    },

    async listTokens(req) {
      const page = await app.tokens.list(pageSize(req.pageSize), decodeCursor(req.pageToken));
      return { tokens: page.rows.map(toToken), nextPageToken: page.next };
    },

    async revokeToken(req) {
      if (req.tokenId !== "") {
        return {
          token: toToken(await app.tokens.revoke({ id: uuidField("token_id", req.tokenId) })),
        };
      }
      if (req.name === "") throw invalid("token_id or name is required");
      return { token: toToken(await app.tokens.revoke({ name: req.name })) };
    },
  };
}
