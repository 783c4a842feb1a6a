/**
 * The hostile client of the fault suite (hostile.ts), run as a process of
 * its own so that its work does not slow the suite's own measurements:
 *
 *   tsx attacker.ts streams URL CONNECTIONS STREAMS SECONDS
 *     h2c connections that each open STREAMS streams to CreateTask with
 *     HEADERS only (no END_STREAM, no token), and keep the connections
 *     open for SECONDS.
 *   tsx attacker.ts slow URL SOCKETS SECONDS
 *     HTTP/1.1 requests without a token that declare a 100,000-byte body
 *     and send one byte of it every 2 s, for SECONDS.
 *   tsx attacker.ts tokens URL CONNECTIONS SECONDS
 *     as many unary calls with random, well-formed bearer tokens as
 *     CONNECTIONS keep-alive connections can make, for SECONDS.
 *
 * Every socket binds 127.0.0.2 (loopback), so the coordinator counts the
 * attacker as a source of its own, apart from the suite's clients on
 * 127.0.0.1. It prints one JSON line of what it saw, then exits.
 */
import { randomBytes } from "node:crypto";
import * as http from "node:http";
import * as net from "node:net";

const [mode = "", target = "", a = "0", b = "0", c = "0"] = process.argv.slice(2);
const url = new URL(target);
const host = url.hostname;
const port = Number(url.port);
const localAddress = "127.0.0.2";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An HTTP/2 frame: 9-byte header and payload. */
function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([h, payload]);
}

/** An HPACK literal header field without indexing (new name): small and stateless. */
function literal(name: string, value: string): Buffer {
  const n = Buffer.from(name);
  const v = Buffer.from(value);
  if (n.length > 126 || v.length > 126) throw new Error("header too long for this encoder");
  return Buffer.concat([Buffer.from([0x00, n.length]), n, Buffer.from([v.length]), v]);
}

async function streams(connections: number, perConnection: number, seconds: number) {
  const block = Buffer.concat([
    literal(":method", "POST"),
    literal(":scheme", "http"),
    literal(":path", "/meshwork.v1.TaskService/CreateTask"),
    literal(":authority", `${host}:${port}`),
    literal("content-type", "application/json"),
  ]);
  let opened = 0;
  let bytesIn = 0;
  let refusedConnections = 0;
  const sockets: net.Socket[] = [];
  await Promise.all(
    Array.from(
      { length: connections },
      () =>
        new Promise<void>((resolve) => {
          const s = net.connect({ host, port, localAddress }, () => {
            const out: Buffer[] = [
              Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
              frame(0x4, 0, 0, Buffer.alloc(0)),
            ];
            for (let i = 0; i < perConnection; i++) {
              out.push(frame(0x1, 0x4, 1 + 2 * i, block)); // END_HEADERS, no END_STREAM
              opened++;
            }
            s.write(Buffer.concat(out));
            resolve();
          });
          s.on("data", (d: Buffer) => {
            bytesIn += d.length;
          });
          s.on("error", () => {
            refusedConnections++;
            resolve();
          });
          sockets.push(s);
        }),
    ),
  );
  await sleep(seconds * 1000);
  const open = sockets.filter((s) => !s.destroyed).length;
  for (const s of sockets) s.destroy();
  return { opened, bytesIn, refusedConnections, openAtEnd: open };
}

async function slow(count: number, seconds: number) {
  let answered = 0;
  let closed = 0;
  const statuses: Record<string, number> = {};
  const sockets: net.Socket[] = [];
  const started = Date.now();
  const answerMs: number[] = [];
  for (let i = 0; i < count; i++) {
    const s = net.connect({ host, port, localAddress }, () => {
      s.write(
        `POST /meshwork.v1.TaskService/CreateTask HTTP/1.1\r\nHost: ${host}:${port}\r\n` +
          "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
      );
    });
    let seen = "";
    s.on("data", (d: Buffer) => {
      if (seen === "") {
        answered++;
        answerMs.push(Date.now() - started);
      }
      seen += d.toString("latin1");
      const m = /^HTTP\/1\.1 (\d+)/.exec(seen);
      if (m?.[1] && seen.length === d.length) statuses[m[1]] = (statuses[m[1]] ?? 0) + 1;
    });
    s.on("close", () => closed++);
    s.on("error", () => {});
    sockets.push(s);
  }
  const drip = setInterval(() => {
    for (const s of sockets) if (!s.destroyed) s.write("1");
  }, 2000);
  await sleep(seconds * 1000);
  clearInterval(drip);
  const open = sockets.filter((s) => !s.destroyed).length;
  for (const s of sockets) s.destroy();
  answerMs.sort((x, y) => x - y);
  return {
    sockets: count,
    answered,
    statuses,
    closedByServer: closed,
    openAtEnd: open,
    lastAnswerMs: answerMs.at(-1) ?? null,
  };
}

async function tokens(connections: number, seconds: number) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections, localAddress });
  const statuses: Record<string, number> = {};
  let sent = 0;
  const until = Date.now() + seconds * 1000;
  const one = () =>
    new Promise<void>((resolve) => {
      const body = "{}";
      const req = http.request(
        {
          host,
          port,
          agent,
          method: "POST",
          path: "/meshwork.v1.TaskService/ListTasks",
          headers: {
            "content-type": "application/json",
            "content-length": body.length,
            authorization: `Bearer mw_${randomBytes(32).toString("base64url")}`,
          },
        },
        (res) => {
          statuses[String(res.statusCode)] = (statuses[String(res.statusCode)] ?? 0) + 1;
          res.resume();
          res.on("end", () => resolve());
          res.on("error", () => resolve());
        },
      );
      req.on("error", () => {
        statuses.error = (statuses.error ?? 0) + 1;
        resolve();
      });
      req.end(body);
      sent++;
    });
  await Promise.all(
    Array.from({ length: connections }, async () => {
      while (Date.now() < until) await one();
    }),
  );
  agent.destroy();
  return { sent, perSecond: Math.round(sent / seconds), statuses };
}

let result: unknown;
if (mode === "streams") result = await streams(Number(a), Number(b), Number(c));
else if (mode === "slow") result = await slow(Number(a), Number(b));
else if (mode === "tokens") result = await tokens(Number(a), Number(b));
else throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(result));
process.exit(0);
