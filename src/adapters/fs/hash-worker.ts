/**
 * SHA-256 of large uploads on a worker thread of the fs store, and their writes to disk
 * started from there (hash-worker-program.ts): the main thread only reads the socket and
 * copies each MiB once, and never waits on the disk, while the worker hashes and the
 * thread pool writes and flushes. One worker per store, started on first use, shared by
 * every upload (each a session), ended by the store's close.
 * Why: docs/decisions/depot-blob-uploads.md, "The fs store's upload".
 */
import { Worker } from "node:worker_threads";
import { WORKER_SOURCE } from "./hash-worker-program.js";

/** The size of the buffers {@link HashWorker.buffer} lends: one write to a blob's file. */
export const WRITE_BYTES = 1024 * 1024;
/**
 * Buffers of WRITE_BYTES shared with the worker (SharedArrayBuffer), per store: a message
 * names a slot instead of moving memory. Moving a MiB each way registered it as new
 * external memory in the receiving thread every time, and V8 answers that with full
 * garbage collections (measured: 600-900 ms of server CPU per 256 MiB upload with moves,
 * against 390-470 ms hashing on the main thread).
 */
const SLOTS = 16;
/** Bytes posted to the worker and not yet hashed (and written), per session, past which `update` waits. */
const MAX_IN_FLIGHT = 8 * 1024 * 1024;
/**
 * Bytes written between background flushes (fdatasync) of a session's file. A bare
 * 256 MiB write + fsync on this host took 1.5 s with one fsync at the end, 0.9 s with a
 * flush every 32 MiB; 16 and 32 MiB measured alike (docs/decisions/depot-archives.md).
 */
export const FLUSH_BYTES = 32 * 1024 * 1024;

/** A session's file (see {@link HashWorker.start}). */
export interface SessionFile {
  /** The descriptor of the file, opened empty for writing; the caller keeps it open until `digest` or `drop` settles. */
  fd: number;
  /** Start an fdatasync every FLUSH_BYTES written. */
  sync: boolean;
  /** Called (on the caller's thread) with the bytes written when a background fdatasync starts. */
  onFlush?: (written: number) => void;
}

/** One body's hash on the worker (and, with a file, its writes). */
export interface HashSession {
  /**
   * Hands `bytes` (the next bytes of the body, in order) to the worker, which may take
   * their memory (the caller must not use them after). Resolves at once unless more than
   * MAX_IN_FLIGHT bytes of this session wait to be hashed: then once fewer do. One call
   * at a time per session (await each). Rejects once a write or flush of the session's
   * file failed. O(1).
   */
  update(bytes: Buffer): Promise<void>;
  /**
   * The body's digest (64 lower-case hex) once every byte handed over is hashed (and
   * written, and the flush in flight done); rejects with the first write or flush failure.
   */
  digest(): Promise<string>;
  /**
   * Forgets the session (a failed upload); resolves once the worker will touch its file no
   * more (the caller may close it then). Never rejects.
   */
  drop(): Promise<void>;
}

/** The hashing worker of one store. */
export interface HashWorker {
  /**
   * A new session; with `file`, the worker also writes each buffer to it (appending, in
   * order) and flushes it in the background, so the caller's thread never waits on the disk.
   */
  start(file?: SessionFile): HashSession;
  /**
   * A buffer of WRITE_BYTES to fill and hand to `update` whole or as its start
   * (`subarray(0, n)`): a free slot shared with the worker when there is one (nothing
   * moves, the slot is free again once written and hashed), else a new buffer that
   * `update` moves. Its contents are garbage; the caller must not use it after `update`. O(1).
   */
  buffer(): Buffer;
  /** Gives back a buffer from `buffer()` that was not handed to `update` (a slot is free again). O(1). */
  release(buffer: Buffer): void;
  /** Ends the thread once the hashes asked of it are done; later sessions start a new one. */
  close(): Promise<void>;
}

/** A write or flush failure as the worker reports it. */
interface WorkerFailure {
  message: string;
  code?: string;
}

/** What the worker posts back, one field set besides `id`. */
interface WorkerMessage {
  id: number;
  hashed?: number;
  /** With `hashed`: the slot those bytes were in, free again. */
  slot?: number;
  flush?: number;
  error?: WorkerFailure;
  /** With `error`: the answer to `end`. */
  final?: boolean;
  hex?: string;
  dropped?: boolean;
}

/** The slots of one thread: each one's view, which memory is which slot, and the free ones. */
interface Slots {
  views: Buffer[];
  index: Map<ArrayBufferLike, number>;
  free: number[];
}

interface Pending {
  inFlight: number;
  onFlush?: (written: number) => void;
  /** Resolves an `update` waiting for the worker to catch up. */
  resume?: () => void;
  done?: { resolve(hex: string): void; reject(error: unknown): void };
  dropping?: boolean;
  /** Settles the session's `drop()`: the worker touches its file no more. */
  gone(): void;
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
 * const handle = await open("blob.tmp", "wx");
 * const written = hashes.start({ fd: handle.fd, sync: true }); // writes and hashes on the worker
 * await written.update(Buffer.from("hello"));
 * await written.digest(); // "2cf24dba…", the file holds "hello"
 * await handle.close();
 * await hashes.close();
 * ```
 */
export function createHashWorker(): HashWorker {
  let worker: Worker | undefined;
  let exited: Promise<void> | undefined;
  let nextId = 0;
  const sessions = new Map<number, Pending>();
  /** The current thread's slots: each one's view, which view is which slot, and the free ones. */
  let slots: Slots | undefined;

  function failAll(error: unknown): void {
    for (const pending of sessions.values()) {
      pending.fail(error);
      // The thread is gone: it writes no more to any session's file.
      pending.gone();
    }
    sessions.clear();
  }

  /** The worker answered `end` or `drop`: it touches the session's file no more. */
  function forget(id: number, pending: Pending): void {
    sessions.delete(id);
    pending.gone();
  }

  function onMessage(m: WorkerMessage, own: Slots): void {
    // A slot is free again once written and hashed, whatever became of its session.
    if (m.slot !== undefined) own.free.push(m.slot);
    const pending = sessions.get(m.id);
    if (!pending) return;
    if (m.hashed !== undefined) {
      pending.inFlight -= m.hashed;
      if (pending.inFlight <= MAX_IN_FLIGHT) pending.resume?.();
    } else if (m.flush !== undefined) pending.onFlush?.(m.flush);
    else if (m.error !== undefined) {
      pending.fail(Object.assign(new Error(m.error.message), m.error.code ? { code: m.error.code } : {}));
      if (m.final) forget(m.id, pending);
    } else if (m.hex !== undefined) {
      forget(m.id, pending);
      pending.done?.resolve(m.hex);
    } else if (m.dropped) forget(m.id, pending);
  }

  function started(): Worker {
    if (worker) return worker;
    // New slots for each thread: one that died may have left its slots in any state.
    const shared = Array.from({ length: SLOTS }, () => new SharedArrayBuffer(WRITE_BYTES));
    const views = shared.map((memory) => Buffer.from(memory));
    const own: Slots = { views, index: new Map(shared.map((memory, i) => [memory, i])), free: views.map((_, i) => i) };
    slots = own;
    const thread = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: { flushBytes: FLUSH_BYTES, slots: shared },
    });
    // The thread never keeps the process alive; the store's close ends it.
    thread.unref();
    thread.on("message", (m: WorkerMessage) => onMessage(m, own));
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
    start(file?: SessionFile): HashSession {
      const thread = started();
      const id = nextId++;
      let failure: { error: unknown } | undefined;
      let gone!: () => void;
      const ended = new Promise<void>((resolve) => (gone = resolve));
      const pending: Pending = {
        inFlight: 0,
        gone,
        onFlush: file?.onFlush,
        fail(error) {
          failure ??= { error };
          pending.resume?.();
          pending.done?.reject(error);
        },
      };
      sessions.set(id, pending);
      if (file) thread.postMessage({ op: "open", id, fd: file.fd, sync: file.sync });
      return {
        async update(bytes) {
          if (failure) throw failure.error;
          pending.inFlight += bytes.byteLength;
          // A slot of this thread is named; a buffer that owns its whole memory moves to the worker;
          // anything else (a slice of a pooled Buffer, an old thread's slot) is copied by the structured clone.
          const slot = bytes.byteOffset === 0 ? slots?.index.get(bytes.buffer) : undefined;
          const owned = bytes.byteOffset === 0 && bytes.buffer.byteLength === bytes.byteLength;
          const message = { op: "update", id, buf: bytes.buffer, offset: bytes.byteOffset, length: bytes.byteLength };
          if (slot !== undefined && worker === thread)
            thread.postMessage({ op: "update", id, slot, length: bytes.byteLength });
          else if (owned && !(bytes.buffer instanceof SharedArrayBuffer))
            thread.postMessage(message, [bytes.buffer as ArrayBuffer]);
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
          // Once `end` is posted its answer ends the session; otherwise ask the worker to drop it.
          if (sessions.has(id) && !pending.done && !pending.dropping) {
            pending.dropping = true;
            thread.postMessage({ op: "drop", id });
          }
          return ended;
        },
      };
    },
    buffer() {
      started();
      const slot = slots!.free.pop();
      return slot === undefined ? Buffer.allocUnsafeSlow(WRITE_BYTES) : slots!.views[slot]!;
    },
    release(buffer) {
      const slot = slots?.index.get(buffer.buffer);
      if (slot !== undefined) slots!.free.push(slot);
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
