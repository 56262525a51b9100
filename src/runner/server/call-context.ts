/**
 * The context values a server (startRunnerServer, createRunnerHandler) sets on each
 * StreamLogs call, and the batch protocol a request iterable may offer the service.
 */
import { createContextKey, type ContextKey, type ContextValues } from "@connectrpc/connect";
import type { CallItem, ReceivedLine } from "../protocol/received-line.js";

/**
 * Context value a server sets so a call ends UNAVAILABLE (with `runner-committed`)
 * when the server shuts down; see startRunnerServer.
 */
export const kShutdownSignal = createContextKey<AbortSignal | undefined>(undefined, {
  description: "runner shutdown signal",
});

/**
 * Context value a server sets to learn when a call has passed authentication (after its
 * first item): until then it reads the call's first message only, within a small limit.
 */
export const kCallAuthenticated = createContextKey<(() => void) | undefined>(undefined, {
  description: "runner call authenticated",
});

/**
 * Context value a server sets so the idle sweep can tell a call the server itself holds
 * back (its reader paused behind the store backlog, runner/service/store-backlog.ts) from a silent one:
 * true while this call's reader waits for the backlog to drain.
 */
export const kCallHeldBack = createContextKey<(() => boolean) | undefined>(undefined, {
  description: "runner call held back",
});

/**
 * Context value a server sets to learn which job a call writes to, once the call has
 * passed authentication (never before: an unauthenticated caller's claim names nothing).
 * A drain names the calls it cut by these request IDs.
 */
export const kCallJob = createContextKey<((requestId: string) => void) | undefined>(undefined, {
  description: "runner call job",
});

/**
 * Context value the service sets when a call starts: the token (or authorize hook) check of
 * a request ID, which a server calls with the ID read from a compressed first message
 * before that message is decompressed (runner/server/first-message-peek.ts). Throws the refusal.
 */
export const kFirstItemCheck = createContextKey<((requestId: string) => Promise<void>) | undefined>(undefined, {
  description: "runner first item check",
});

/** Context value a server sets: the call's peer (its remote address), asked for when needed. */
export const kCallPeer = createContextKey<(() => string | undefined) | undefined>(undefined, {
  description: "runner call peer",
});

/** Context value a server sets to use its own message limit instead of the service's. */
export const kMessageBytes = createContextKey<number | undefined>(undefined, { description: "runner message limit" });

/**
 * A request iterable may also offer its items in batches under this key (the gRPC fast
 * path of createRunnerHandler does): the service then awaits once per batch instead of
 * once per item. Every item still goes through the same rules, one by one.
 */
export const kItemBatches: unique symbol = Symbol.for("runner-depot.itemBatches");

/**
 * A source of items in batches: resolves with the next non-empty batch, or null at the end.
 * Items may be {@link ReceivedLine}s (a log line kept as bytes), which only the service reads.
 */
export interface ItemBatchSource {
  [kItemBatches](): () => Promise<readonly CallItem[] | null>;
}

/**
 * connect's ContextValues (same storage: each value an own property keyed by the key's
 * symbol) with its methods on a prototype: `createContextValues()` made three closures for
 * every call, which an open stream kept for its whole life.
 *
 * @example
 * const values = new CallValues().set(kShutdownSignal, signal);
 */
export class CallValues implements ContextValues {
  get<T>(key: ContextKey<T>): T {
    return key.id in this ? ((this as unknown as Record<symbol, T>)[key.id] as T) : key.defaultValue;
  }

  set<T>(key: ContextKey<T>, value: T): this {
    (this as unknown as Record<symbol, T>)[key.id] = value;
    return this;
  }

  delete(key: ContextKey<unknown>): this {
    delete (this as unknown as Record<symbol, unknown>)[key.id];
    return this;
  }
}
