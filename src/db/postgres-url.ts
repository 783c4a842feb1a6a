/**
 * Where a PostgreSQL URL connects, for postgres.js, which reads a Unix
 * socket only from its `path` option (or PGHOST) and sends every query
 * parameter it does not know to the server as a setting (which the server
 * refuses). libpq's forms are read as libpq reads them:
 *
 * - a `host` parameter: a directory is the Unix socket
 *   (`postgresql://user@localhost/db?host=/var/run/postgresql`), a name
 *   replaces the URL's host;
 * - a percent-encoded directory as the host
 *   (`postgresql://user@%2Fvar%2Frun%2Fpostgresql/db`);
 * - a `port` parameter replaces the URL's port.
 *
 * The socket is the directory's `.s.PGSQL.<port>` (5432 unless a port is
 * given). Over a socket `sslmode` is dropped, as libpq ignores it there.
 * One host only: a comma-separated list is left as it is (postgres.js
 * reads a list in the URL's host, not in a parameter).
 */
export function postgresTarget(url: string): { url: string; path?: string } {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return { url };
  }
  const hostParam = u.searchParams.get("host");
  const portParam = u.searchParams.get("port");
  if (hostParam?.includes(",") || portParam?.includes(",")) return { url };
  const port = portParam || u.port || "5432";
  const dir = hostParam || safeDecode(u.hostname);
  if (dir?.startsWith("/")) {
    for (const name of ["host", "port", "sslmode"]) u.searchParams.delete(name);
    return { url: u.toString(), path: `${dir.replace(/\/+$/, "")}/.s.PGSQL.${port}` };
  }
  if (hostParam === null && portParam === null) return { url };
  if (hostParam) u.hostname = hostParam;
  if (portParam) u.port = portParam;
  u.searchParams.delete("host");
  u.searchParams.delete("port");
  return { url: u.toString() };
}

function safeDecode(s: string): string | undefined {
  try {
    return decodeURIComponent(s);
  } catch {
    return undefined;
  }
}

/** host:port/database of a PostgreSQL URL (a Unix socket: its path and the database), without the user or password. */
export function postgresPlace(url: string): string {
  try {
    const u = new URL(url);
    const database = u.pathname.length > 1 ? u.pathname : "";
    const target = postgresTarget(url);
    if (target.path) return `${target.path}${database && ` (database ${database.slice(1)})`}`;
    const t = new URL(target.url);
    return `${t.hostname}:${t.port || 5432}${database}`;
  } catch {
    return "the server in DATABASE_URL";
  }
}
