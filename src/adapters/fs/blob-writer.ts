/**
 * Writing an upload's bytes into a blob's temp file (blobs.ts `putBlob`): hashed, bounded,
 * and flushed to disk while it arrives.
 *
 * A body of up to SLAB_BYTES is gathered, hashed here and written with one `writev`. A
 * larger one is copied into SharedArrayBuffer slabs of SLAB_BYTES, and each full slab is
 * hashed and written by the slab worker (slab-worker.ts), so the socket's thread only
 * receives and copies: measured here, hashing was ~160 ms of its ~330 ms per 256 MiB, and
 * retaining the socket's chunks until their `writev` cost it ~100 ms of GC. At most SLABS
 * slabs per upload are in use: when all are, the next read of the body waits
 * (backpressure on the socket), so memory per upload is O(SLABS × SLAB_BYTES) whatever its
 * size.
 *
 * With sync on, a background `fdatasync` is started every FLUSH_BYTES written (never
 * more than one at a time, and never waited for while the body arrives), so the disk
 * writes while the socket reads and the fsync before the rename finds only the tail.
 */
import { createHash } from "node:crypto";
import diagnostics_channel from "node:diagnostics_channel";
import type { FileHandle } from "node:fs/promises";
import type { BlobInfo, PutBlobOptions } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import { startSlabUpload, type SlabUpload } from "./slab-worker.js";

/** Bytes per slab: one file write and one message to the hashing worker. */
const SLAB_BYTES = 1024 * 1024;
/** Slabs one upload may hold: how far receiving may run ahead of writing and hashing. */
const SLABS = 8;
/**
 * Bytes written between background flushes (fdatasync) while the body arrives. A bare
 * 256 MiB write + fsync on this host took 1.5 s with one fsync at the end, 0.9 s with a
 * flush every 32 MiB.
 */
const FLUSH_BYTES = 32 * 1024 * 1024;

/**
 * Events of the blob writer, for tests and diagnostics (published only while someone
 * subscribes): `{ type: "slab", bytes }` when a slab goes to the slab worker,
 * `{ type: "flush", written }` when a background fdatasync starts with `written`
 * bytes in the file.
 */
export const blobWriteChannel = diagnostics_channel.channel("runner-depot:fs-blob-write");

/** A message on {@link blobWriteChannel}. */
export type BlobWriteEvent = { type: "slab"; bytes: number } | { type: "flush"; written: number };

/**
 * Streams `body` into the temp file `handle` (opened empty), hashing it and enforcing
 * `opts.maxBytes` (TOO_LARGE as soon as it is passed). Every write, hash and flush started
 * has settled when this returns or throws, so the caller may close the handle; the
 * caller syncs the file before renaming it. O(size) time, O(SLABS × SLAB_BYTES) memory.
 */
export async function writeBody(handle: FileHandle, body: AsyncIterable<Uint8Array>, opts: PutBlobOptions, sync: boolean): Promise<BlobInfo> {
  const sink = new BlobSink(handle, sync);
  let size = 0;
  try {
    for await (const chunk of body) {
      size += chunk.byteLength;
      if (opts.maxBytes !== undefined && size > opts.maxBytes) {
        throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
      }
      const wait = sink.add(chunk);
      if (wait) await wait;
    }
    return { digest: `sha256:${await sink.end()}`, size };
  } catch (error) {
    await sink.abort();
    throw error;
  }
}

/** A slab handed to the slab worker; free again once `done` settles. */
interface SlabInFlight {
  slab: Uint8Array;
  done: Promise<unknown>;
}

/** The write side of one upload (see the module comment). */
class BlobSink {
  /** Chunks of a body not yet past SLAB_BYTES (small mode), kept as received. */
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  /** Set once the body passed SLAB_BYTES (slab mode). */
  private upload: SlabUpload | undefined;
  /** SLABS slabs, shared with the slab worker (slab mode). */
  private slabs: SharedArrayBuffer | undefined;
  private slab: Uint8Array | undefined;
  private slabUsed = 0;
  private slabsMade = 0;
  private readonly inFlight: SlabInFlight[] = [];
  /** File offset of the next slab. */
  private position = 0;
  /** Bytes the worker has written (answered). */
  private writtenBytes = 0;
  private unflushed = 0;
  private flushing: Promise<void> | undefined;
  private flushError: unknown;

  constructor(
    private readonly handle: FileHandle,
    private readonly sync: boolean,
  ) {}

  /** Takes a chunk; a promise when the caller must wait for a free slab before the next. */
  add(chunk: Uint8Array): Promise<void> | undefined {
    if (this.upload) return this.fill(chunk);
    this.pending.push(chunk);
    this.pendingBytes += chunk.byteLength;
    if (this.pendingBytes < SLAB_BYTES) return undefined;
    // Past one slab: the rest of the body goes through slabs and the worker.
    const gathered = this.pending;
    this.slabs = new SharedArrayBuffer(SLABS * SLAB_BYTES);
    this.upload = startSlabUpload(this.handle.fd, this.slabs);
    this.pending = [];
    this.pendingBytes = 0;
    return (async () => {
      for (const part of gathered) await this.fill(part);
    })();
  }

  /** The hex digest once every byte is written and hashed (the file is not yet synced). */
  async end(): Promise<string> {
    if (!this.upload) {
      const hash = createHash("sha256");
      for (const chunk of this.pending) hash.update(chunk);
      if (this.pendingBytes > 0) await writeAll(this.handle, this.pending, 0);
      return hash.digest("hex");
    }
    if (this.slabUsed > 0) this.dispatch();
    for (const { done } of this.inFlight) await done;
    await this.flushing;
    if (this.flushError !== undefined) throw this.flushError;
    return this.upload.digest();
  }

  /**
   * Waits for everything started to settle, whatever its outcome, and drops the upload.
   * Every slab's write is answered before this returns: the caller closes the file, and
   * a write still running would land in whatever file reused its descriptor.
   */
  async abort(): Promise<void> {
    await Promise.allSettled([this.flushing, ...this.inFlight.map((s) => s.done)]);
    this.upload?.drop();
  }

  /** Copies `chunk` into slabs, handing each full one on. */
  private async fill(chunk: Uint8Array): Promise<void> {
    let offset = 0;
    while (offset < chunk.byteLength) {
      this.slab ??= await this.freeSlab();
      const n = Math.min(SLAB_BYTES - this.slabUsed, chunk.byteLength - offset);
      this.slab.set(chunk.subarray(offset, offset + n), this.slabUsed);
      this.slabUsed += n;
      offset += n;
      if (this.slabUsed === SLAB_BYTES) this.dispatch();
    }
  }

  /** A slab to fill: a new one while fewer than SLABS exist, else the oldest once the worker is done with it. */
  private async freeSlab(): Promise<Uint8Array> {
    if (this.slabsMade < SLABS) {
      this.slabsMade += 1;
      return new Uint8Array(this.slabs!, (this.slabsMade - 1) * SLAB_BYTES, SLAB_BYTES);
    }
    const oldest = this.inFlight.shift()!;
    await oldest.done;
    return oldest.slab;
  }

  /** Hands the current slab to the worker, to be hashed and written at its file offset. */
  private dispatch(): void {
    const slab = this.slab!;
    const bytes = slab.subarray(0, this.slabUsed);
    this.position += bytes.byteLength;
    this.slab = undefined;
    this.slabUsed = 0;
    const done = this.upload!.write(bytes, this.position - bytes.byteLength).then(() => this.written(bytes.byteLength));
    done.catch(() => undefined); // awaited in end(), freeSlab() or abort(); never an unhandled rejection
    this.inFlight.push({ slab, done });
    if (blobWriteChannel.hasSubscribers) blobWriteChannel.publish({ type: "slab", bytes: bytes.byteLength } satisfies BlobWriteEvent);
  }

  /** Counts written bytes and starts a background fdatasync every FLUSH_BYTES, one at a time. */
  private written(bytes: number): void {
    this.writtenBytes += bytes;
    this.unflushed += bytes;
    if (!this.sync || this.unflushed < FLUSH_BYTES || this.flushing) return;
    this.unflushed = 0;
    if (blobWriteChannel.hasSubscribers) blobWriteChannel.publish({ type: "flush", written: this.writtenBytes } satisfies BlobWriteEvent);
    // A failed flush must fail the upload: a later fsync may not report the same error again.
    this.flushing = this.handle.datasync().then(
      () => {
        this.flushing = undefined;
      },
      (error: unknown) => {
        this.flushError ??= error;
        this.flushing = undefined;
      },
    );
  }
}

/** Writes `chunks` whole at `position`, continuing after a short write. */
async function writeAll(handle: FileHandle, chunks: Uint8Array[], position: number): Promise<void> {
  let rest = chunks;
  let at = position;
  for (;;) {
    const total = rest.reduce((sum, c) => sum + c.byteLength, 0);
    if (total === 0) return;
    const { bytesWritten } = await handle.writev(rest, at);
    if (bytesWritten === total) return;
    at += bytesWritten;
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
