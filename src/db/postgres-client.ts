import postgres from "postgres";
import { postgresTarget } from "./postgres-url.js";

/** postgres.js's options, as the coordinator's clients pass them. */
export type PostgresOptions = postgres.Options<Record<string, postgres.PostgresType>>;

/**
 * A postgres.js client of a PostgreSQL URL, read as libpq reads it: a Unix
 * socket or a host and port named by parameters (postgres-url.ts). Every
 * client of DATABASE_URL is made here: the coordinator's (database.ts,
 * which loads this module only on PostgreSQL), the tests' and the
 * benchmarks'.
 */
export function connectPostgres(url: string, options: PostgresOptions = {}): postgres.Sql {
  const target = postgresTarget(url);
  return postgres(target.url, { ...options, ...(target.path && { path: target.path }) });
}
