/**
 * Writing an upload's bytes into a blob's temp file (blobs.ts `putBlob`): hashed, bounded,
 * and flushed to disk while it arrives.
 * Why: docs/decisions/depot-publish-durability.md, "blob-writer.ts: hashing and gathering upload chunks".
 */
import { createHash } from "node:crypto";
import diagnostics_channel from "node:diagnostics_channel";
import type { FileHandle } from "node:fs/promises";
import type { BlobInfo, PutBlobOptions } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import { FLUSH_BYTES, WRITE_BYTES, type HashWorker } from "./hash-worker.js";

/**
 * Events of the blob writer, for tests and diagnostics (published only while someone
 * subscribes): `{ type: "flush", written }` when a background fdatasync starts with
 * `written` bytes in the file.
 */
const blobWriteChannel = diagnostics_channel.channel("runner-depot:fs-blob-write");

/** A message on {@link blobWriteChannel}. */
export type BlobWriteEvent = { type: "flush"; written: number };

function publishFlush(written: number): void {
  if (blobWriteChannel.hasSubscribers) blobWriteChannel.publish({ type: "flush", written } satisfies BlobWriteEvent);
}

/**
 * Streams `body` into the temp file `handle` (opened empty), hashing it and enforcing
 * `opts.maxBytes` (TOO_LARGE as soon as it is passed). Every write and flush started has
 * settled when this returns or throws, so the caller may close the handle; the caller
 * syncs the file before renaming it. With `hashes` (hash-worker.ts) the store's worker
 * thread writes and hashes each gathered MiB (see `writeOnWorker`); without, this thread
 * hashes each chunk as it arrives and the thread pool writes each gathered MiB.
 * O(size) time, O(WRITE_BYTES) memory (plus the worker's bounded backlog).
 */
export async function writeBody(
  handle: FileHandle,
  body: AsyncIterable<Uint8Array>,
  opts: PutBlobOptions,
  sync: boolean,
  hashes?: HashWorker,
): Promise<BlobInfo> {
  if (hashes) return writeOnWorker(handle, body, opts, sync, hashes);
  const hash = createHash("sha256");
  const writer = new GatheringWriter(handle, sync);
  let size = 0;
  try {
    for await (const chunk of body) {
      size = counted(size, chunk, opts);
      hash.update(chunk);
      if (writer.add(chunk)) await writer.write();
    }
    await writer.write();
  } finally {
    await writer.settled();
  }
  writer.rethrow();
  return { digest: `sha256:${hash.digest("hex")}`, size };
}

/** `size` plus the chunk's bytes; TOO_LARGE past `opts.maxBytes`. O(1). */
function counted(size: number, chunk: Uint8Array, opts: PutBlobOptions): number {
  const total = size + chunk.byteLength;
  if (opts.maxBytes !== undefined && total > opts.maxBytes) {
    throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
  }
  return total;
}

/**
 * The body copied once into MiB slots shared with the worker (hash-worker.ts `buffer`),
 * which writes each to the file, hashes it, and starts an fdatasync every FLUSH_BYTES: this thread only reads the
 * socket and copies, and waits on nothing but the worker's bounded backlog, so taking in
 * the body, hashing and writing overlap. A failed write or flush fails the upload; on any
 * failure the session is dropped (the worker done with the file) before this throws.
 * Why: docs/decisions/depot-blob-uploads.md, "The fs store's upload".
 */
async function writeOnWorker(
  handle: FileHandle,
  body: AsyncIterable<Uint8Array>,
  opts: PutBlobOptions,
  sync: boolean,
  hashes: HashWorker,
): Promise<BlobInfo> {
  const session = hashes.start({ fd: handle.fd, sync, onFlush: publishFlush });
  // The buffer being filled; undefined while one is being handed over (the worker's then).
  let buffer: Buffer | undefined = hashes.buffer();
  let filled = 0;
  let size = 0;
  try {
    for await (const chunk of body) {
      size = counted(size, chunk, opts);
      for (let at = 0; at < chunk.byteLength;) {
        const n = Math.min(chunk.byteLength - at, WRITE_BYTES - filled);
        buffer!.set(n === chunk.byteLength ? chunk : chunk.subarray(at, at + n), filled);
        filled += n;
        at += n;
        if (filled < WRITE_BYTES) continue;
        const full = buffer!;
        buffer = undefined;
        await session.update(full);
        buffer = hashes.buffer();
        filled = 0;
      }
    }
    if (filled > 0) {
      const last = buffer!.subarray(0, filled);
      buffer = undefined;
      await session.update(last);
    }
    return { digest: `sha256:${await session.digest()}`, size };
  } catch (error) {
    await session.drop();
    throw error;
  } finally {
    // Never handed over (an empty tail, or a failure while filling): the slot is free again.
    if (buffer) hashes.release(buffer);
  }
}

/** The write side of one upload (see the module comment). */
class GatheringWriter {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  /** The write in flight (one at a time, appending in order). */
  private writing: Promise<void> = Promise.resolve();
  private written = 0;
  private unflushed = 0;
  private flushing: Promise<void> | undefined;
  private failure: { error: unknown } | undefined;

  constructor(
    private readonly handle: FileHandle,
    private readonly sync: boolean,
  ) {}

  /** Gathers a chunk; true when WRITE_BYTES are gathered and the caller should write. */
  add(chunk: Uint8Array): boolean {
    this.pending.push(chunk);
    this.pendingBytes += chunk.byteLength;
    return this.pendingBytes >= WRITE_BYTES;
  }

  /** Starts writing what is gathered once the write before it is done (nothing when empty). */
  async write(): Promise<void> {
    if (this.pendingBytes === 0) return;
    await this.writing;
    const chunks = this.pending;
    const bytes = this.pendingBytes;
    this.pending = [];
    this.pendingBytes = 0;
    this.writing = writeAll(this.handle, chunks).then(() => this.wrote(bytes));
  }

  /** Waits for the write and the fdatasync in flight, whatever their outcome. */
  async settled(): Promise<void> {
    await this.writing.catch((error: unknown) => this.fail(error));
    await this.flushing;
  }

  /** Rethrows the first failed write or background fdatasync. */
  rethrow(): void {
    if (this.failure) throw this.failure.error;
  }

  private fail(error: unknown): void {
    this.failure ??= { error };
  }

  /** Counts written bytes and starts a background fdatasync every FLUSH_BYTES, one at a time. */
  private wrote(bytes: number): void {
    this.written += bytes;
    this.unflushed += bytes;
    if (!this.sync || this.unflushed < FLUSH_BYTES || this.flushing) return;
    this.unflushed = 0;
    publishFlush(this.written);
    // A failed flush must fail the upload: a later fsync need not report the same error again.
    this.flushing = this.handle.datasync().then(
      () => {
        this.flushing = undefined;
      },
      (error: unknown) => {
        this.fail(error);
        this.flushing = undefined;
      },
    );
  }
}

/** Appends `chunks` whole, continuing after a short write. */
async function writeAll(handle: FileHandle, chunks: Uint8Array[]): Promise<void> {
  let rest = chunks;
  let total = rest.reduce((sum, c) => sum + c.byteLength, 0);
  while (total > 0) {
    const { bytesWritten } = await handle.writev(rest);
    if (bytesWritten === total) return;
    total -= bytesWritten;
    rest = skipBytes(rest, bytesWritten);
  }
}

/** `chunks` without their first `n` bytes. */
function skipBytes(chunks: Uint8Array[], n: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  let skip = n;
  for (const chunk of chunks) {
    if (skip >= chunk.byteLength) skip -= chunk.byteLength;
    else {
      out.push(skip > 0 ? chunk.subarray(skip) : chunk);
      skip = 0;
    }
  }
  return out;
}
