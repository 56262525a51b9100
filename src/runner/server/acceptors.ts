/**
 * The listening sockets of a runner server. Node's event loop (libuv ≥ 1.49, Node 22) accepts ONE connection
 * per listening socket per loop turn, so a busy server listens on several sockets.
 * Why: docs/decisions/runner-throughput.md, "acceptors.ts: why several listening sockets".
 */
import net from "node:net";
import type { AddressInfo } from "node:net";

/** Default listening sockets on Linux (elsewhere 1). */
export const DEFAULT_ACCEPTORS = 8;
/**
 * The most listening sockets a server takes: each is a file descriptor, and more gain nothing on any core count this
 * runs on.
 */
const MAX_ACCEPTORS = 64;

/** The listening sockets of one server. */
interface Acceptors {
  /** The port bound. */
  readonly port: number;
  /** Listening sockets actually bound (≥ 1). */
  readonly count: number;
  /** Stops accepting; resolves once every socket accepted through them has closed (net.Server.close). */
  close(): Promise<void>;
}

/** Options of {@link listenAcceptors}. */
interface AcceptorOptions {
  host: string;
  /** 0 asks the OS (the other sockets then bind the port the first one got). */
  port: number;
  /** Wanted listening sockets; 1 binds one, without SO_REUSEPORT. */
  count: number;
  /** Kernel accept queue per socket. */
  backlog: number;
}

/**
 * Listens on `count` sockets sharing one port and hands each accepted connection to `onConnection`.
 * Rejects only if the first socket cannot listen (e.g. the port is in use). O(count).
 *
 * @example
 * const h2 = http2.createServer();
 * const acceptors = await listenAcceptors({ host: "127.0.0.1", port: 0, count: 8, backlog: 4096 }, (s) =>
 *   h2.emit("connection", s),
 * );
 */
export async function listenAcceptors(
  options: AcceptorOptions,
  onConnection: (socket: net.Socket) => void,
): Promise<Acceptors> {
  if (!Number.isInteger(options.count) || options.count < 1 || options.count > MAX_ACCEPTORS) {
    throw new RangeError(`acceptors must be an integer from 1 to ${MAX_ACCEPTORS}, got ${options.count}`);
  }
  const wanted = process.platform === "linux" ? options.count : 1;
  const reusePort = wanted > 1;
  const servers: net.Server[] = [];
  if (reusePort && options.port !== 0) {
    // A port held by another server — another runner server of the same user included, which
    // SO_REUSEPORT would otherwise let us join and split its connections with — must fail with
    // EADDRINUSE as with one socket: bind it plainly first (it fails if anyone holds it), then
    // let go and bind the group. (Between the two, another process could take the port: with a
    // plain socket the group's first bind fails the same way; with SO_REUSEPORT it is joined.)
    const probe = await listenOne({ host: options.host, port: options.port, backlog: 1, reusePort: false }, (s) =>
      s.destroy(),
    );
    await new Promise<void>((resolve) => probe.close(() => resolve()));
  }
  const first = await listenOne(
    { host: options.host, port: options.port, backlog: options.backlog, reusePort },
    onConnection,
  );
  servers.push(first);
  const port = (first.address() as AddressInfo).port;
  for (let i = 1; i < wanted; i++) {
    try {
      servers.push(await listenOne({ host: options.host, port, backlog: options.backlog, reusePort }, onConnection));
    } catch {
      // No SO_REUSEPORT here (an older Node ignores the option: EADDRINUSE): one socket it is.
      break;
    }
  }
  return {
    port,
    count: servers.length,
    close: () =>
      Promise.all(servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve())))).then(() => undefined),
  };
}

function listenOne(
  listen: { host: string; port: number; backlog: number; reusePort: boolean },
  onConnection: (socket: net.Socket) => void,
): Promise<net.Server> {
  const server = net.createServer(onConnection);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    // `reusePort` is in Node ≥ 22.12's ListenOptions; the cast keeps older typings compiling.
    server.listen(listen as net.ListenOptions, () => {
      server.off("error", reject);
      resolve(server);
    });
  });
}
