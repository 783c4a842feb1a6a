import { createHash, randomBytes, randomUUID } from "node:crypto";
import { and, desc, eq, inArray, isNotNull, isNull, lt, or, sql } from "drizzle-orm";
import { DomainError, invalid, notFound } from "../core/errors.js";
import { byTimeAndId, keysetAfter, type Position, pageOf } from "../core/paging.js";
import type { Db } from "../db/database.js";
import { lazy } from "../db/lazy.js";
import { type TokenRoleName, type TokenRow, tokens } from "../db/schema/index.js";

/** Every token starts with this, so that a leaked one is easy to recognise (and to scan for). */
export const tokenPrefix = "mw_";

/** A new secret: 256 random bits, base64url, with the prefix. */
export function newSecret(): string {
  return `${tokenPrefix}${randomBytes(32).toString("base64url")}`;
}

/**
 * Whether `secret` has the shape of a token `newSecret` makes: the prefix
 * and 43 base64url characters. Anything else is refused without a lookup.
 */
export function isTokenShaped(secret: string): boolean {
  return /^mw_[A-Za-z0-9_-]{43}$/.test(secret);
}

/** What is stored of a secret: its SHA-256, hex. */
export function digestOf(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

const namePattern = /^[A-Za-z0-9._-]{1,128}$/;

/** Token names: 1–128 characters of [A-Za-z0-9._-]. */
export function tokenName(name: string): string {
  if (!namePattern.test(name)) {
    throw invalid("name must be 1–128 characters of [A-Za-z0-9._-]");
  }
  return name;
}

/** Tokens: made, listed, revoked, and looked up by digest. */
export function createTokenStore(db: Db) {
  const byDigest = lazy(() =>
    db
      .select()
      .from(tokens)
      .where(sql`${tokens.digest} = ${sql.placeholder("digest")}::text`)
      .prepare("meshwork_token_by_digest"),
  );

  async function insert(
    name: string,
    role: TokenRoleName,
  ): Promise<{ row: TokenRow; secret: string }> {
    const secret = newSecret();
    const rows = await db
      .insert(tokens)
      .values({ id: randomUUID(), name: tokenName(name), role, digest: digestOf(secret) })
      .onConflictDoNothing({ target: tokens.name })
      .returning();
    const row = rows[0];
    if (!row) {
      throw new DomainError("already_exists", "TOKEN_NAME_TAKEN", `a token named ${name} exists`);
    }
    return { row, secret };
  }

  return {
    create: insert,

    /**
     * On first start, with no token at all: makes an admin token named
     * `admin`, hands its secret to `keep` before committing (if keeping it
     * fails, no token is made), and returns true; false when tokens exist.
     * Replicas starting together make one (the table is locked for the check).
     */
    async createFirstAdmin(keep: (secret: string) => void): Promise<boolean> {
      return db.transaction(async (tx) => {
        await tx.execute(sql`lock table ${tokens} in share row exclusive mode`);
        const [any] = await tx.select({ id: tokens.id }).from(tokens).limit(1);
        if (any) return false;
        keep((await createTokenStore(tx).create("admin", "admin")).secret);
        return true;
      });
    },

    /** The token with this digest, revoked or not; undefined when none. */
    async findByDigest(digest: string): Promise<TokenRow | undefined> {
      const [row] = await byDigest().execute({ digest });
      return row;
    },

    /** Which of these token ids are revoked (for the streams they hold open: revocation.ts). */
    async revokedAmong(ids: string[]): Promise<string[]> {
      if (ids.length === 0) return [];
      const rows = await db
        .select({ id: tokens.id })
        .from(tokens)
        .where(and(inArray(tokens.id, ids), isNotNull(tokens.revokedAt)));
      return rows.map((r) => r.id);
    },

    /** One page, newest first. */
    async list(
      size: number,
      after: Position | undefined,
    ): Promise<{ rows: TokenRow[]; next: string }> {
      const rows = await db
        .select()
        .from(tokens)
        .where(keysetAfter([tokens.createdAt, tokens.id], after, "desc"))
        .orderBy(desc(tokens.createdAt), desc(tokens.id))
        .limit(size + 1);
      return pageOf(rows, size, (r) => byTimeAndId(r.createdAt, r.id));
    },

    /** Revokes by id or name (a revoked token stays revoked from its first revocation). */
    async revoke(by: { id: string } | { name: string }): Promise<TokenRow> {
      const idOrName = "id" in by ? by.id : by.name;
      const which = "id" in by ? eq(tokens.id, by.id) : eq(tokens.name, by.name);
      await db
        .update(tokens)
        .set({ revokedAt: sql`now()` })
        .where(and(which, isNull(tokens.revokedAt)));
      const [row] = await db.select().from(tokens).where(which);
      if (!row) throw notFound(`token ${idOrName}`);
      return row;
    },

    /** Records that these tokens were used now, at most once a minute each. */
    async touch(ids: string[]): Promise<void> {
      if (ids.length === 0) return;
      await db
        .update(tokens)
        .set({ lastUsedAt: sql`now()` })
        .where(
          and(
            inArray(tokens.id, ids),
            or(isNull(tokens.lastUsedAt), lt(tokens.lastUsedAt, sql`now() - interval '1 minute'`)),
          ),
        );
    },
  };
}

export type TokenStore = ReturnType<typeof createTokenStore>;
