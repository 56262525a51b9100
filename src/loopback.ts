/**
 * Network helpers shared by the runner server and the depot server.
 */
import { BlockList, isIP } from "node:net";

// BlockList also matches IPv4-mapped IPv6 forms (`::ffff:127.0.0.2`, `::ffff:7f00:2`) against IPv4 rules.
const LOOPBACK = new BlockList();
LOOPBACK.addSubnet("127.0.0.0", 8, "ipv4");
LOOPBACK.addAddress("::1", "ipv6");

/**
 * True for a loopback host: `localhost`, 127.0.0.0/8, `::1`, and IPv4-mapped 127.x
 * (`::ffff:127.0.0.2`); brackets around an IPv6 literal are accepted. Anything else,
 * including other names that might resolve to loopback, is false.
 *
 * @example
 * isLoopbackHost("127.0.0.1"); // true
 * isLoopbackHost("[::ffff:127.0.0.2]"); // true
 * isLoopbackHost("0.0.0.0"); // false
 */
export function isLoopbackHost(host: string): boolean {
  const h = host
    .trim()
    .replace(/^\[(.*)\]$/, "$1")
    .toLowerCase();
  if (h === "localhost") return true;
  const family = isIP(h);
  if (family === 4) return LOOPBACK.check(h, "ipv4");
  if (family === 6) return LOOPBACK.check(h, "ipv6");
  return false;
}
