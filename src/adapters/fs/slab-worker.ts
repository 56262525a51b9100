/**
 * Large uploads hashed and written on a worker thread (blob-writer.ts), so the socket's
 * thread only receives and copies while another core hashes SHA-256 and hands the bytes
 * to the file. An upload's bytes travel through one SharedArrayBuffer of slabs, given to
 * the worker once (posting a SharedArrayBuffer costs ~0.1–0.2 ms, too much per MiB): each
 * message then names a slab's range and its file offset. The worker hashes the range,
 * writes it with `pwrite` (the file descriptor is the process's, shared by its threads)
 * and answers; the slab is then free for the next bytes. Hashing and writing on the same
 * thread reads each slab once, from that core's cache.
 *
 * One worker per process, shared by every upload (each its own hash, keyed by id): with
 * all of it on one extra core, concurrent uploads go no slower than they did on the main
 * thread. The worker is started on first use, unreferenced while no upload uses it (a
 * process with nothing else to do exits), and replaced after a crash (the uploads it held
 * fail; a later one starts a new worker).
 */
import { Worker } from "node:worker_threads";
import { RunnerDepotError } from "../../errors.js";

/**
 * The worker's code, evaluated as a CommonJS script (no file to resolve in the ESM, CJS and
 * source builds alike). `start` gives it an upload's file descriptor and slabs; it answers
 * `write` with `written` once the range is hashed and written whole (the range may then be
 * reused), `digest` with the hex digest, and either with `error` (with the errno code of a
 * failed write) instead. Answers come in the order of the messages.
 */
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
const { createHash } = require("node:crypto");
const { writeSync } = require("node:fs");
const uploads = new Map();
parentPort.on("message", (m) => {
  try {
    if (m.op === "start") {
      uploads.set(m.id, { hash: createHash("sha256"), fd: m.fd, slabs: m.slabs });
    } else if (m.op === "write") {
      const upload = uploads.get(m.id);
      const bytes = new Uint8Array(upload.slabs, m.offset, m.length);
      upload.hash.update(bytes);
      for (let done = 0; done < bytes.length; ) done += writeSync(upload.fd, bytes, done, bytes.length - done, m.position + done);
      parentPort.postMessage({ id: m.id, op: "written" });
    } else if (m.op === "digest") {
      const upload = uploads.get(m.id);
      uploads.delete(m.id);
      parentPort.postMessage({ id: m.id, op: "digest", hex: upload.hash.digest("hex") });
    } else if (m.op === "drop") {
      uploads.delete(m.id);
    }
  } catch (error) {
    uploads.delete(m.id);
    parentPort.postMessage({ id: m.id, op: "error", message: String(error && error.message), code: error && error.code, syscall: error && error.syscall });
  }
});
`;

/** One upload on the worker. Calls are answered in the order they are made. */
export interface SlabUpload {
  /**
   * Hashes `bytes` (a view on the upload's slabs) and writes them at file offset
   * `position`; settles once both are done, and until then `bytes` must not change.
   */
  write(bytes: Uint8Array, position: number): Promise<void>;
  /** The hex digest of every byte written; the upload is finished. */
  digest(): Promise<string>;
  /** Forgets the upload (it failed); answers still due are rejected. */
  drop(): void;
}

interface Waiter {
  resolve(value: string): void;
  reject(error: Error): void;
}

/** The process's slab worker, with the answers each upload still awaits. */
interface SlabWorker {
  worker: Worker;
  waiting: Map<number, Waiter[]>;
}

let current: SlabWorker | undefined;
let nextId = 1;

function slabWorker(): SlabWorker {
  if (current) return current;
  // No inherited flags: a host started with `--import tsx` (or any preload) need not load it here.
  const worker = new Worker(WORKER_SOURCE, { eval: true, execArgv: [] });
  const state: SlabWorker = { worker, waiting: new Map() };
  worker.unref();
  worker.on("message", (m: { id: number; op: string; hex?: string; message?: string; code?: string; syscall?: string }) => {
    const queue = state.waiting.get(m.id);
    const waiter = queue?.shift();
    if (!waiter) return;
    if (queue!.length === 0) forget(state, m.id);
    if (m.op === "error") waiter.reject(workerError(m));
    else waiter.resolve(m.hex ?? "");
  });
  const fail = (error: unknown) => {
    if (current === state) current = undefined;
    const cause = new RunnerDepotError("INTERNAL", "the upload worker stopped", { cause: error });
    for (const queue of state.waiting.values()) for (const waiter of queue) waiter.reject(cause);
    state.waiting.clear();
  };
  worker.on("error", fail);
  worker.on("exit", (code) => fail(new Error(`exit code ${code}`)));
  current = state;
  return state;
}

/** A failed write keeps its errno code (ENOSPC answers 503 like any other write's). */
function workerError(m: { message?: string; code?: string; syscall?: string }): Error {
  return Object.assign(new Error(m.message ?? "upload worker error"), m.code ? { code: m.code, syscall: m.syscall } : {});
}

/** An upload no longer awaits answers: the worker may be unreferenced once none does. O(1). */
function forget(state: SlabWorker, id: number): void {
  state.waiting.delete(id);
  if (state.waiting.size === 0) state.worker.unref();
}

/** Queues an answer for upload `id`, referencing the worker while any is due (the process waits for it). */
function expect(state: SlabWorker, id: number): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    let queue = state.waiting.get(id);
    if (!queue) {
      if (state.waiting.size === 0) state.worker.ref();
      state.waiting.set(id, (queue = []));
    }
    queue.push({ resolve, reject });
  });
}

/**
 * Starts an upload on the slab worker: its bytes pass through `slabs` into the open file
 * `fd`. O(1); each write is O(its bytes) on the worker and O(1) here.
 *
 * @example
 * const slabs = new SharedArrayBuffer(4 * 1024 * 1024);
 * const upload = startSlabUpload(handle.fd, slabs);
 * const slab = new Uint8Array(slabs, 0, 1024 * 1024);
 * slab.set(bytes);
 * await upload.write(slab.subarray(0, bytes.length), 0);
 * const hex = await upload.digest();
 */
export function startSlabUpload(fd: number, slabs: SharedArrayBuffer): SlabUpload {
  const state = slabWorker();
  const id = nextId++;
  state.worker.postMessage({ id, op: "start", fd, slabs });
  return {
    write(bytes, position) {
      if (bytes.buffer !== slabs) throw new TypeError("write() takes a view on the upload's slabs");
      const answered = expect(state, id);
      state.worker.postMessage({ id, op: "write", offset: bytes.byteOffset, length: bytes.byteLength, position });
      return answered.then(() => undefined);
    },
    digest() {
      const answered = expect(state, id);
      state.worker.postMessage({ id, op: "digest" });
      return answered;
    },
    drop() {
      const queue = state.waiting.get(id);
      if (queue) {
        forget(state, id);
        const dropped = new RunnerDepotError("INTERNAL", "the upload was dropped");
        for (const waiter of queue) waiter.reject(dropped);
      }
      if (current === state) state.worker.postMessage({ id, op: "drop" });
    },
  };
}
