/**
 * The runner port's connection cap, server-wide and per peer address (issue 31): each
 * connection holds a descriptor and an HTTP/2 session whether or not it ever opens a stream,
 * so without a cap a peer could take every descriptor and legitimate calls would fail.
 * Why: docs/decisions/runner-server.md, "connection-cap.ts: connections on the runner port".
 */
import type { Socket } from "node:net";
import { connectionCapFor } from "../../depot/server/descriptors.js";
import { stripUndefined } from "../service/strip-undefined.js";

/** Connection bounds of the runner port ({@link RunnerServerSettings}). */
export interface RunnerConnectionLimits {
  /** Open connections at most; more are closed on arrival (default 8 192, never over three quarters of the descriptor limit). */
  maxConnections: number;
  /** Open connections from one peer address at most; more are closed on arrival (default 2 048). */
  maxConnectionsPerPeer: number;
}

/** The defaults of {@link RunnerConnectionLimits} (a fleet behind one NAT address shares the per-peer cap). */
export const DEFAULT_RUNNER_CONNECTION_LIMITS: RunnerConnectionLimits = {
  maxConnections: 8192,
  maxConnectionsPerPeer: 2048,
};

/** Counts a server's connections and turns away those past its caps. */
export interface ConnectionGate {
  /** True when `socket` is admitted (counted until it closes); false when it was destroyed. O(1). */
  admit(socket: Socket): boolean;
  /** Connections open now. */
  readonly open: number;
  /** Connections turned away since the start. */
  readonly refused: number;
  /** The server-wide cap in force (after the descriptor limit). */
  readonly maxConnections: number;
}

/**
 * A gate for the connections of one server. A connection past a cap is destroyed before any
 * byte is read or written (no TLS handshake, no HTTP/2 session): the client sees the
 * connection reset and retries later (the runner-depot agent: with its backoff, as UNAVAILABLE).
 *
 * @example
 * const gate = createConnectionGate({ maxConnectionsPerPeer: 64 });
 * listenAcceptors(options, (socket) => {
 *   if (gate.admit(socket)) server.emit("connection", socket);
 * });
 */
export function createConnectionGate(limits: Partial<RunnerConnectionLimits> = {}): ConnectionGate {
  const wanted = { ...DEFAULT_RUNNER_CONNECTION_LIMITS, ...stripUndefined(limits) };
  for (const [name, value] of Object.entries(wanted)) {
    if (!(Number.isInteger(value) && value > 0)) throw new RangeError(`${name} must be a positive integer`);
  }
  const maxConnections = connectionCapFor(wanted.maxConnections);
  const perPeerCap = wanted.maxConnectionsPerPeer;
  let open = 0;
  let refused = 0;
  const perPeer = new Map<string, number>();
  return {
    admit(socket) {
      const peer = socket.remoteAddress ?? "";
      const fromPeer = perPeer.get(peer) ?? 0;
      if (open >= maxConnections || fromPeer >= perPeerCap) {
        refused++;
        socket.on("error", () => undefined);
        socket.destroy();
        return false;
      }
      open++;
      perPeer.set(peer, fromPeer + 1);
      socket.once("close", () => {
        open--;
        const left = (perPeer.get(peer) ?? 1) - 1;
        if (left > 0) perPeer.set(peer, left);
        else perPeer.delete(peer);
      });
      return true;
    },
    get open() {
      return open;
    },
    get refused() {
      return refused;
    },
    maxConnections,
  };
}
