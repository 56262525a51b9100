/**
 * SHA-256 of large uploads on a worker thread of the fs store, so hashing runs beside the
 * main thread's socket reads and the thread pool's writes instead of after them: one
 * 256 MiB upload's hash (~230 ms) no longer adds to the time the main thread takes to
 * take in its bytes. One worker per store, started on first use, shared by every upload
 * (each a session), ended by the store's close.
 * Why: docs/decisions/depot-blob-uploads.md, "The fs store's upload".
 */
import { Worker } from "node:worker_threads";

/** Bytes posted to the worker and not yet hashed, per session, past which `update` waits. */
const MAX_IN_FLIGHT = 8 * 1024 * 1024;

/**
 * The worker's program (plain JavaScript, run with `eval`, as checkpointer.ts: no file to
 * resolve next to the built or the TypeScript sources).
 */
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
const { createHash } = require("node:crypto");
const hashes = new Map();
parentPort.on("message", (m) => {
  if (m.op === "update") {
    let hash = hashes.get(m.id);
    if (!hash) hashes.set(m.id, (hash = createHash("sha256")));
    hash.update(new Uint8Array(m.buf, m.offset, m.length));
    parentPort.postMessage({ id: m.id, hashed: m.length });
  } else if (m.op === "end") {
    const hash = hashes.get(m.id) ?? createHash("sha256");
    hashes.delete(m.id);
    parentPort.postMessage({ id: m.id, hex: hash.digest("hex") });
  } else if (m.op === "drop") hashes.delete(m.id);
  else if (m.op === "close") parentPort.close();
});
`;

/** One body's hash on the worker. */
export interface HashSession {
  /**
   * Hands `bytes` (the next bytes of the body, in order) to the worker, which may take
   * their memory (the caller must not use them after). Resolves at once unless more than
   * MAX_IN_FLIGHT bytes of this session wait to be hashed: then once fewer do. O(1).
   */
  update(bytes: Buffer): Promise<void>;
  /** The body's digest (64 lower-case hex) once every byte handed over is hashed. */
  digest(): Promise<string>;
  /** Forgets the session (a failed upload). */
  drop(): void;
}

/** The hashing worker of one store. */
export interface HashWorker {
  start(): HashSession;
  /** Ends the thread once the hashes asked of it are done; later sessions start a new one. */
  close(): Promise<void>;
}

interface Pending {
  inFlight: number;
  /** Resolves an `update` waiting for the worker to catch up. */
  resume?: () => void;
  done?: { resolve(hex: string): void; reject(error: unknown): void };
  fail(error: unknown): void;
}

/**
 * Creates the (lazily started) hashing worker of one store.
 *
 * @example
 * ```ts
 * const hashes = createHashWorker();
 * const session = hashes.start();
 * await session.update(Buffer.from("hello"));
 * await session.digest(); // "2cf24dba…"
 * await hashes.close();
 * ```
 */
export function createHashWorker(): HashWorker {
  let worker: Worker | undefined;
  let exited: Promise<void> | undefined;
  let nextId = 0;
  const sessions = new Map<number, Pending>();

  function failAll(error: unknown): void {
    for (const pending of sessions.values()) pending.fail(error);
    sessions.clear();
  }

  function started(): Worker {
    if (worker) return worker;
    const thread = new Worker(WORKER_SOURCE, { eval: true });
    // The thread never keeps the process alive; the store's close ends it.
    thread.unref();
    thread.on("message", (m: { id: number; hashed?: number; hex?: string }) => {
      const pending = sessions.get(m.id);
      if (!pending) return;
      if (m.hashed !== undefined) {
        pending.inFlight -= m.hashed;
        if (pending.inFlight <= MAX_IN_FLIGHT) pending.resume?.();
      } else if (m.hex !== undefined) {
        sessions.delete(m.id);
        pending.done?.resolve(m.hex);
      }
    });
    thread.on("error", (error) => {
      if (worker === thread) worker = undefined;
      failAll(error);
    });
    exited = new Promise((resolve) =>
      thread.once("exit", () => {
        if (worker === thread) worker = undefined;
        failAll(new Error("the hashing worker exited"));
        resolve();
      }),
    );
    worker = thread;
    return thread;
  }

  return {
    start(): HashSession {
      const thread = started();
      const id = nextId++;
      let failure: { error: unknown } | undefined;
      const pending: Pending = {
        inFlight: 0,
        fail(error) {
          failure ??= { error };
          pending.resume?.();
          pending.done?.reject(error);
        },
      };
      sessions.set(id, pending);
      return {
        async update(bytes) {
          if (failure) throw failure.error;
          pending.inFlight += bytes.byteLength;
          // A buffer that owns its whole memory moves to the worker; a slice of a shared one (a pooled
          // Buffer) is copied by the structured clone instead.
          const owned = bytes.byteOffset === 0 && bytes.buffer.byteLength === bytes.byteLength;
          const message = { op: "update", id, buf: bytes.buffer, offset: bytes.byteOffset, length: bytes.byteLength };
          if (owned) thread.postMessage(message, [bytes.buffer as ArrayBuffer]);
          else thread.postMessage({ ...message, buf: new Uint8Array(bytes).buffer, offset: 0 });
          while (pending.inFlight > MAX_IN_FLIGHT && !failure)
            await new Promise<void>((resolve) => (pending.resume = resolve));
          pending.resume = undefined;
          // Set by pending.fail meanwhile (the narrowing above does not see callbacks).
          const failed = failure as { error: unknown } | undefined;
          if (failed) throw failed.error;
        },
        digest() {
          if (failure) return Promise.reject(failure.error);
          return new Promise<string>((resolve, reject) => {
            pending.done = { resolve, reject };
            thread.postMessage({ op: "end", id });
          });
        },
        drop() {
          if (!sessions.delete(id)) return;
          thread.postMessage({ op: "drop", id });
        },
      };
    },
    async close() {
      const thread = worker;
      if (!thread) return;
      // Ref'd while it closes: a process whose last work awaits this must not exit under the await.
      thread.ref();
      thread.postMessage({ op: "close" });
      await exited;
    },
  };
}
