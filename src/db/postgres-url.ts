/**
 * Where a PostgreSQL URL connects, for postgres.js, which reads a Unix
 * socket only from its `path` option (or PGHOST) and sends every query
 * parameter it does not know to the server as a setting (which the server
 * refuses). libpq's forms are read as libpq reads them:
 *
 * - a `host` parameter: a directory is the Unix socket
 *   (`postgresql://user@localhost/db?host=/var/run/postgresql`), a name
 *   or an IPv4 address replaces the URL's host;
 * - a percent-encoded directory as the host
 *   (`postgresql://user@%2Fvar%2Frun%2Fpostgresql/db`);
 * - a `port` parameter replaces the URL's port.
 *
 * The socket is the directory's `.s.PGSQL.<port>` (5432 unless a port is
 * given). Over a socket `sslmode` is dropped, as libpq ignores it there.
 * A list of hosts in the URL's host is postgres.js's to read, as long as
 * no parameter names a host or port. Throws, with a message that holds
 * nothing of the URL, for what cannot be read that way: an empty or
 * comma-separated `host` or `port` parameter, either beside a list of
 * hosts, an IPv6 address as the `host` parameter (postgres.js cannot take
 * one), a port that is not one.
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
  for (const [name, value] of [
    ["host", hostParam],
    ["port", portParam],
  ] as const) {
    if (value === null) continue;
    if (value === "" || value.includes(",")) {
      throw new Error(
        `DATABASE_URL's ${name} parameter must name one ${name}, not ${value === "" ? "none" : "a list"}`,
      );
    }
  }
  if ((hostParam !== null || portParam !== null) && u.hostname.includes(",")) {
    throw new Error(
      "DATABASE_URL names a list of hosts: give their ports in it, not as parameters",
    );
  }
  if (portParam !== null && !/^\d{1,5}$/.test(portParam)) {
    throw new Error("DATABASE_URL's port parameter is not a port number");
  }
  const dir = hostParam ?? safeDecode(u.hostname);
  const socketDir = dir?.startsWith("/") ? dir : undefined;
  if (socketDir === undefined && hostParam === null && portParam === null) return { url };
  u.searchParams.delete("host");
  u.searchParams.delete("port");
  if (socketDir !== undefined) {
    u.searchParams.delete("sslmode");
    return { url: u.toString(), path: socketPath(socketDir, portParam ?? u.port) };
  }
  if (hostParam !== null) {
    u.hostname = hostParam;
    if (u.hostname !== hostParam) {
      throw new Error("DATABASE_URL's host parameter is not a host name or a socket directory");
    }
  }
  if (portParam !== null) {
    u.port = portParam;
    if (u.port !== String(Number(portParam))) {
      throw new Error("DATABASE_URL's port parameter is not a port number");
    }
  }
  return { url: u.toString() };
}

/** The Unix socket a directory holds for a port (5432 when none). */
function socketPath(dir: string, port: string): string {
  return `${dir.replace(/\/+$/, "")}/.s.PGSQL.${port || "5432"}`;
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
    const target = postgresTarget(url);
    const t = new URL(target.url);
    const database = t.pathname.length > 1 ? t.pathname : "";
    if (target.path) return `${target.path}${database && ` (database ${database.slice(1)})`}`;
    return `${t.hostname}:${t.port || 5432}${database}`;
  } catch {
    return "the server in DATABASE_URL";
  }
}

/**
 * What is wrong with DATABASE_URL, in words that hold nothing of it (it
 * may hold a password), or undefined: not a PostgreSQL URL, or a host or
 * port parameter postgresTarget cannot read.
 */
export function postgresUrlProblem(url: string): string | undefined {
  if (!/^postgres(ql)?:\/\//i.test(url)) {
    return "DATABASE_URL must be a PostgreSQL URL (postgres://user:password@host:5432/database), or unset for the embedded database";
  }
  try {
    postgresTarget(url);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}
