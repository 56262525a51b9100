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
import type { HashSession } from "./hash-worker.js";

/** Bytes gathered before one write to a blob's temp file. */
const WRITE_BYTES = 1024 * 1024;
/**
 * Bytes written between background flushes (fdatasync) while the body arrives. A bare
 * 256 MiB write + fsync on this host took 1.5 s with one fsync at the end, 0.9 s with a
 * flush every 32 MiB; 16 and 32 MiB measured alike (docs/decisions/depot-archives.md).
 */
const FLUSH_BYTES = 32 * 1024 * 1024;

/**
 * Events of the blob writer, for tests and diagnostics (published only while someone
 * subscribes): `{ type: "flush", written }` when a background fdatasync starts with
 * `written` bytes in the file.
 */
const blobWriteChannel = diagnostics_channel.channel("runner-depot:fs-blob-write");

/** A message on {@link blobWriteChannel}. */
export type BlobWriteEvent = { type: "flush"; written: number };

/**
 * Streams `body` into the temp file `handle` (opened empty), hashing it and enforcing
 * `opts.maxBytes` (TOO_LARGE as soon as it is passed). Every write and flush started has
 * settled when this returns or throws, so the caller may close the handle; the caller
 * syncs the file before renaming it. With `session` (hash-worker.ts) the hash runs on the
 * store's worker thread, fed each gathered MiB once it is written, so hashing, taking in
 * the body and writing it overlap; without, on this thread as each chunk arrives.
 * O(size) time, O(WRITE_BYTES) memory (plus the worker's bounded backlog).
 */
export async function writeBody(
  handle: FileHandle,
  body: AsyncIterable<Uint8Array>,
  opts: PutBlobOptions,
  sync: boolean,
  session?: HashSession,
): Promise<BlobInfo> {
  const hash = session ? undefined : createHash("sha256");
  const writer = new GatheringWriter(handle, sync, session);
  let size = 0;
  try {
    try {
      for await (const chunk of body) {
        size += chunk.byteLength;
        if (opts.maxBytes !== undefined && size > opts.maxBytes) {
          throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
        }
        hash?.update(chunk);
        if (writer.add(chunk)) await writer.write();
      }
      await writer.write();
    } finally {
      await writer.settled();
    }
    writer.rethrow();
    const hex = session ? await session.digest() : hash!.digest("hex");
    return { digest: `sha256:${hex}`, size };
  } catch (error) {
    session?.drop();
    throw error;
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
    private readonly session?: HashSession,
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
    const session = this.session;
    if (!session) {
      this.writing = writeAll(this.handle, chunks).then(() => this.wrote(bytes));
      return;
    }
    // One copy into a buffer of its own, written, then handed to the worker (which takes
    // its memory); the next write waits for both, so the worker hashes in the body's order.
    const gathered = Buffer.concat(chunks, bytes);
    this.writing = writeAll(this.handle, [gathered]).then(() => {
      this.wrote(bytes);
      return session.update(gathered);
    });
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
    if (blobWriteChannel.hasSubscribers)
      blobWriteChannel.publish({ type: "flush", written: this.written } satisfies BlobWriteEvent);
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
