import { lookup } from "node:dns/promises";
import { BlockList, isIP } from "node:net";

/**
 * Addresses a dispatch does not reach unless the operator allows them
 * (--dispatch-allow): this network, private, shared (CGNAT), loopback,
 * link-local, IETF protocol, benchmarking, multicast and reserved IPv4;
 * unspecified, loopback, IPv4-embedding (compatible, NAT64, 6to4),
 * site-local, unique-local, link-local and multicast IPv6 (IPv4-mapped
 * addresses are checked as their IPv4). So a worker token cannot
 * make the coordinator a forwarder of requests into its own network.
 */
const nonPublic = new BlockList();
for (const [net, prefix] of [
  ["0.0.0.0", 8],
  ["10.0.0.0", 8],
  ["100.64.0.0", 10],
  ["127.0.0.0", 8],
  ["169.254.0.0", 16],
  ["172.16.0.0", 12],
  ["192.0.0.0", 24],
  ["192.168.0.0", 16],
  ["198.18.0.0", 15],
  ["224.0.0.0", 3],
] as const) {
  nonPublic.addSubnet(net, prefix, "ipv4");
}
for (const [net, prefix] of [
  ["::", 128],
  ["::1", 128],
  // IPv4 inside IPv6: IPv4-compatible, NAT64 (which reaches private IPv4
  // through a gateway), 6to4; and the old site-local block.
  ["::", 96],
  ["64:ff9b::", 96],
  ["64:ff9b:1::", 48],
  ["2002::", 16],
  ["fec0::", 10],
  ["fc00::", 7],
  ["fe80::", 10],
  ["ff00::", 8],
] as const) {
  nonPublic.addSubnet(net, prefix, "ipv6");
}

/** An address as compared: an IPv4-mapped IPv6 address as its IPv4, IPv6 in lower case. */
export function plainAddress(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return mapped?.[1] ?? address.toLowerCase();
}

const family = (ip: string) => (isIP(ip) === 4 ? "ipv4" : "ipv6");

/** Which addresses a dispatch may reach: public ones, the allowed blocks, and the worker's own registration address. */
export function createAddressPolicy(allow: readonly string[]) {
  const allowed = new BlockList();
  for (const block of allow) {
    const [net = "", prefix = ""] = block.split("/");
    allowed.addSubnet(net, Number(prefix), family(net));
  }
  return {
    /** Whether `ip` may be reached for a worker registered from `registeredFrom` ("" when unknown). */
    allows(ip: string, registeredFrom: string): boolean {
      const a = plainAddress(ip);
      if (isIP(a) === 0) return false;
      if (!nonPublic.check(a, family(a))) return true;
      if (allowed.check(a, family(a))) return true;
      return registeredFrom !== "" && plainAddress(registeredFrom) === a;
    },
  };
}

export type AddressPolicy = ReturnType<typeof createAddressPolicy>;

/** The host of a URL as an IP literal (brackets of IPv6 removed), or undefined for a name. */
export function literalHost(url: URL): string | undefined {
  const host = url.hostname.replace(/^\[|\]$/g, "");
  return isIP(host) === 0 ? undefined : host;
}

/** Every address a name resolves to (both families). */
export async function resolveAll(host: string): Promise<{ address: string; family: number }[]> {
  return lookup(host, { all: true, verbatim: true });
}
