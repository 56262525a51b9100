/**
 * The program of the fs store's hashing worker (hash-worker.ts), as the text its Worker
 * evaluates. Messages in: `open` (a session's file), `update` (its next bytes), `end`,
 * `drop`, `close`; out: `hashed` (with the slot, free again), `flush`, `error`,
 * `hex`, `dropped`. Bytes come in slots (SharedArrayBuffers shared at the start) or moved. Plain JavaScript: it runs without the TypeScript loader.
 * Why: docs/decisions/depot-blob-uploads.md, "The fs store's upload".
 */

/**
 * The worker's program (plain JavaScript, run with `eval`, as checkpointer.ts: no file to
 * resolve next to the built or the TypeScript sources). A session with a file descriptor
 * starts each buffer's write at its offset on the thread pool (pwrite, continuing after a
 * short write), hashes it meanwhile, and answers once both are done; every FLUSH_BYTES
 * written it starts an fdatasync, one at a time. Its first failure is reported once and
 * ends its writes. `end` and `drop` wait for the writes and the flush in flight, so once
 * answered the worker touches the descriptor no more.
 */
export const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const { createHash } = require("node:crypto");
const { write, fdatasync } = require("node:fs");
const { flushBytes: FLUSH_BYTES, slots } = workerData;
const sessions = new Map();
const reply = (m) => parentPort.postMessage(m);
function session(id) {
  let s = sessions.get(id);
  if (!s) {
    s = { hash: createHash("sha256"), fd: -1, sync: false, position: 0, queue: [], writing: false, written: 0, unflushed: 0, busy: 0, idle: [], flushing: false, failed: undefined };
    sessions.set(id, s);
  }
  return s;
}
function fail(id, s, error) {
  if (s.failed) return;
  s.failed = { message: String(error && error.message), code: error && error.code };
  reply({ id, error: s.failed });
}
/** Counts a write or flush done; runs what waits for the session to be idle. */
function settle(s) {
  if (--s.busy === 0) for (const run of s.idle.splice(0)) run();
}
function flushed(id, s) {
  s.unflushed = 0;
  s.flushing = true;
  s.busy++;
  reply({ id, flush: s.written });
  fdatasync(s.fd, (error) => {
    if (error) fail(id, s, error);
    s.flushing = false;
    settle(s);
  });
}
/** pwrite of bytes[at..] at the file's offset "position"; done() once all are written or it failed. */
function writeAt(id, s, bytes, at, position, done) {
  write(s.fd, bytes, at, bytes.length - at, position, (error, n) => {
    if (error || s.failed) {
      if (error) fail(id, s, error);
      return done();
    }
    if (at + n < bytes.length) return writeAt(id, s, bytes, at + n, position + n, done);
    s.written += bytes.length;
    s.unflushed += bytes.length;
    if (s.sync && s.unflushed >= FLUSH_BYTES && !s.flushing) flushed(id, s);
    done();
  });
}
function update(m) {
  const s = session(m.id);
  const bytes = m.slot === undefined ? new Uint8Array(m.buf, m.offset, m.length) : new Uint8Array(slots[m.slot], 0, m.length);
  let pending = 1;
  const answer = () => {
    if (--pending > 0) return;
    // A slot is the caller's again once written and hashed.
    reply({ id: m.id, hashed: m.length, slot: m.slot });
  };
  if (!s.failed && s.fd >= 0) {
    pending++;
    s.busy++;
    // The update's answer (naming its slot) before whatever waits for the session to be idle
    // (the answer to end or drop), so a slot is free again when the caller learns the end.
    s.queue.push({ bytes, position: s.position, done: () => (answer(), settle(s)) });
    s.position += bytes.length;
    if (!s.writing) pump(m.id, s);
  }
  if (!s.failed) s.hash.update(bytes);
  answer();
}
/**
 * Starts the session's next queued write once the one before it is done: one at a time,
 * as concurrent writes to one file only contend for its inode lock (measured: the
 * server's CPU time per 256 MiB upload doubled with 8 in flight).
 */
function pump(id, s) {
  const next = s.queue.shift();
  if (!next) return void (s.writing = false);
  s.writing = true;
  if (s.failed) {
    next.done();
    return pump(id, s);
  }
  writeAt(id, s, next.bytes, 0, next.position, () => {
    next.done();
    pump(id, s);
  });
}
parentPort.on("message", (m) => {
  if (m.op === "open") {
    const s = session(m.id);
    s.fd = m.fd;
    s.sync = m.sync;
  } else if (m.op === "update") update(m);
  else if (m.op === "end" || m.op === "drop") {
    const s = session(m.id);
    sessions.delete(m.id);
    const answer = () => {
      if (m.op === "drop") reply({ id: m.id, dropped: true });
      else if (s.failed) reply({ id: m.id, error: s.failed, final: true });
      else reply({ id: m.id, hex: s.hash.digest("hex") });
    };
    if (s.busy === 0) answer();
    else s.idle.push(answer);
  } else if (m.op === "close") parentPort.close();
});
`;
