/**
 * gRPC health checking (`grpc.health.v1.Health`, the protocol Kubernetes gRPC probes,
 * grpc_health_probe and load balancers speak) for the runner server: SERVING while it
 * accepts calls, NOT_SERVING from the start of a drain. createRunnerHandler serves it on
 * the same listener; hosts that mount the runner service themselves can serve it too.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import {
  Health,
  HealthCheckResponse_ServingStatus as Status,
  HealthCheckResponseSchema,
  type HealthCheckResponse,
} from "../../gen/grpc/health/v1/health_pb.js";
import { Runner } from "../../gen/runner/v1/runner_pb.js";
import { kCallPeer } from "./call-context.js";

/** The status a runner server reports. */
export type HealthStatus = "SERVING" | "NOT_SERVING";

/** Options of {@link createRunnerHealth}. */
export interface RunnerHealthOptions {
  /** Service names answered besides "" (the server as a whole); default `["runner.v1.Runner"]`. */
  services?: readonly string[];
  /** Watch calls open at once; more end RESOURCE_EXHAUSTED (health calls are not authenticated); default 100. */
  maxWatchers?: number;
  /**
   * Watch calls open at once from one remote address (when the server says which: kCallPeer);
   * more end RESOURCE_EXHAUSTED, so one anonymous client cannot hold every slot; default 10.
   */
  maxWatchersPerPeer?: number;
}

/** The Health service implementation plus the status it reports. */
export interface RunnerHealth extends ServiceImpl<typeof Health> {
  /** What Check, List and Watch report for every known service. */
  readonly status: HealthStatus;
  /** Changes the status; Watch calls get the new one at once. */
  setStatus(status: HealthStatus): void;
  /** Ends every Watch call (status OK) and any later one at once: the server is going away. */
  close(): void;
  /** Watch calls open. */
  readonly watchers: number;
}

/**
 * Creates the health service of a runner server, SERVING until told otherwise.
 *
 * @example
 * // A host that mounts the runner service itself serves health beside it:
 * const health = createRunnerHealth();
 * connectNodeAdapter({ routes: (r) => r.service(Runner, runner).service(Health, health) });
 * process.on("SIGTERM", () => health.setStatus("NOT_SERVING"));
 */
export function createRunnerHealth(options: RunnerHealthOptions = {}): RunnerHealth {
  const services = new Set(["", ...(options.services ?? [Runner.typeName])]);
  const maxWatchers = options.maxWatchers ?? 100;
  let status: HealthStatus = "SERVING";
  let closed = false;
  let watchers = 0;
  const maxPerPeer = options.maxWatchersPerPeer ?? 10;
  // Open Watch calls by remote address; an entry goes when its last call ends.
  const byPeer = new Map<string, number>();
  // Wakes every Watch call on a change; each re-arms its own wait. O(watchers) per change.
  const wakes = new Set<() => void>();
  const wakeAll = () => {
    for (const wake of [...wakes]) wake();
  };
  const answer = (known: boolean): HealthCheckResponse =>
    create(HealthCheckResponseSchema, {
      status: !known ? Status.SERVICE_UNKNOWN : status === "SERVING" ? Status.SERVING : Status.NOT_SERVING,
    });

  return {
    check(request) {
      if (!services.has(request.service))
        throw new ConnectError(`unknown service ${JSON.stringify(request.service.slice(0, 200))}`, Code.NotFound);
      return answer(true);
    },
    list() {
      return { statuses: Object.fromEntries([...services].map((name) => [name, answer(true)])) };
    },
    async *watch(request, ctx) {
      if (watchers >= maxWatchers)
        throw new ConnectError(`over ${maxWatchers} health Watch calls open`, Code.ResourceExhausted);
      const peer = ctx.values.get(kCallPeer)?.();
      const fromPeer = peer === undefined ? 0 : (byPeer.get(peer) ?? 0);
      if (fromPeer >= maxPerPeer)
        throw new ConnectError(`over ${maxPerPeer} health Watch calls open from this address`, Code.ResourceExhausted);
      if (peer !== undefined) byPeer.set(peer, fromPeer + 1);
      watchers++;
      const known = services.has(request.service);
      let wake: (() => void) | null = null;
      const onAbort = () => wake?.();
      ctx.signal.addEventListener("abort", onAbort);
      try {
        let last: Status | null = null;
        for (;;) {
          const now = answer(known);
          if (now.status !== last) {
            last = now.status;
            yield now;
          }
          if (closed || ctx.signal.aborted) return;
          await new Promise<void>((resolve) => {
            wake = resolve;
            wakes.add(resolve);
          });
          if (wake) wakes.delete(wake);
          wake = null;
        }
      } finally {
        ctx.signal.removeEventListener("abort", onAbort);
        if (wake) wakes.delete(wake);
        watchers--;
        if (peer !== undefined) {
          const left = byPeer.get(peer)! - 1;
          if (left === 0) byPeer.delete(peer);
          else byPeer.set(peer, left);
        }
      }
    },
    get status() {
      return status;
    },
    setStatus(next) {
      if (next === status) return;
      status = next;
      wakeAll();
    },
    close() {
      closed = true;
      wakeAll();
    },
    get watchers() {
      return watchers;
    },
  };
}

/** True for a request path of the Health service (served without authentication, not counted as a call in flight). */
export function isHealthPath(path: string | undefined, prefix = ""): boolean {
  return (path ?? "").startsWith(`${prefix}/${Health.typeName}/`);
}
