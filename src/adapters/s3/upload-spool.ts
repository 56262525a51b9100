/**
 * Local copies of the blobs this process recently uploaded to S3, so that a commit hashing
 * the assembled archive reads an item from the page cache instead of back from S3 (a
 * 256 MiB `GetObject` costs radosgw several SHA-256 passes' time). A cache, never the
 * truth: a body is copied as it streams to S3 and kept under its digest only once S3 has
 * it whole and the copy has exactly the stored size; a miss (another replica, a restart,
 * an evicted copy, a failed write) reads S3 as before. Bounded by bytes and age.
 * Why: docs/decisions/depot-blob-uploads.md, "The commit on S3".
 */
import { rmSync } from "node:fs";
import { mkdtemp, open, rename, rm, unlink, type FileHandle } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { BlobReader, ByteRange } from "../../depot/ports.js";

/** Options of {@link createUploadSpool}. */
export interface UploadSpoolOptions {
  /** Bytes of copies kept (the oldest dropped first); 0 keeps none. */
  maxBytes: number;
  /** A copy older than this is dropped when next looked up; default one hour. */
  maxAgeMs?: number;
  /** Directory under which the spool makes its own; default the OS temp dir. */
  parent?: string;
}

/** One body being copied: `tee` passes it on unchanged; `keep` or `drop` ends it. */
export interface SpoolCopy {
  tee(body: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array>;
  /** Keeps the copy as `hex` when it holds exactly `size` bytes; never throws. */
  keep(hex: string, size: number): Promise<void>;
  /** Removes the partial copy; never throws. */
  drop(): Promise<void>;
}

/** Local copies of uploads (see the module comment). */
export interface UploadSpool {
  /** A copy of a body about to upload, or null when none is taken (a declared size over the budget, closed). */
  begin(size?: number): SpoolCopy | null;
  /** The size of the copy of `hex`, or null when there is none (or it is too old: then dropped). */
  sizeOf(hex: string): number | null;
  /** The copy's bytes (or the inclusive `range` within it), or null when there is none. */
  read(hex: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null>;
  /** The copy opened for reads into the caller's buffers (no allocation per read), or null when there is none. */
  open(hex: string): Promise<BlobReader | null>;
  /** Drops the copy of `hex` (its blob was deleted). */
  forget(hex: string): void;
  /** Removes every copy and the spool's directory. */
  close(): Promise<void>;
}

/** Bytes gathered per write and read (one threadpool round trip per MiB). */
const WRITE_BYTES = 1024 * 1024;
/**
 * Smaller blobs are not kept: reading one back from S3 is one request either way (a hit
 * still asks S3 whether the blob is there, see blob-store.ts), and the copy would cost a file.
 */
export const MIN_SPOOLED_BYTES = 1024 * 1024;
/** Bytes written but not yet flushed to the file before the body waits for the disk. */
const MAX_QUEUED = 16 * 1024 * 1024;

/** Spool directories of this process not yet closed: removed at its exit (a store never closed leaves none). */
const liveDirs = new Set<string>();
let exitHooked = false;

function track(dir: string): void {
  liveDirs.add(dir);
  if (exitHooked) return;
  exitHooked = true;
  process.once("exit", () => {
    for (const d of liveDirs) rmSync(d, { recursive: true, force: true });
  });
}

interface Entry {
  file: string;
  size: number;
  at: number;
}

/**
 * A spool of upload copies in a directory of its own (made on first use, removed by
 * `close()`). Lookups are O(1); keeping a copy evicts the oldest, O(evicted).
 *
 * @example
 * const spool = createUploadSpool({ maxBytes: 1024 ** 3 });
 * const copy = spool.begin(size);
 * const info = await upload(copy ? copy.tee(body) : body);
 * await copy?.keep(hex, info.size);
 * const bytes = await spool.read(hex); // page cache, not S3
 */
export function createUploadSpool(options: UploadSpoolOptions): UploadSpool {
  const maxAge = options.maxAgeMs ?? 60 * 60 * 1000;
  // Map order is insertion order: the first entry is the oldest copy.
  const entries = new Map<string, Entry>();
  let total = 0;
  let dir: Promise<string> | null = null;
  let closed = false;
  let serial = 0;

  const directory = () => (dir ??= mkdtemp(path.join(options.parent ?? os.tmpdir(), "runner-depot-s3-spool-")));

  function forget(hex: string, entry: Entry): void {
    entries.delete(hex);
    total -= entry.size;
    // An open reader keeps its descriptor: the bytes stay readable until it closes.
    void unlink(entry.file).catch(() => undefined);
  }

  function admit(hex: string, entry: Entry): void {
    const old = entries.get(hex);
    if (old) forget(hex, old);
    entries.set(hex, entry);
    total += entry.size;
    for (const [oldest, e] of entries) {
      if (total <= options.maxBytes) break;
      forget(oldest, e);
    }
  }

  function begin(size?: number): SpoolCopy | null {
    if (closed || options.maxBytes <= 0) return null;
    if (size !== undefined && (size > options.maxBytes || size < MIN_SPOOLED_BYTES)) return null;
    const name = `part-${process.pid}-${++serial}`;
    let handle: Promise<FileHandle> | null = null;
    let file = "";
    let written = 0;
    let failed = false;
    let queue: Promise<void> = Promise.resolve();
    let queued = 0;
    const fileHandle = () =>
      (handle ??= directory().then((d) => {
        file = path.join(d, name);
        return open(file, "w");
      }));
    // A failed write only stops the copy; the upload it shadows goes on.
    const write = (chunks: Uint8Array[], bytes: number) => {
      queued += bytes;
      queue = queue.then(async () => {
        if (!failed) {
          try {
            const fh = await fileHandle();
            await fh.writev(chunks);
            written += bytes;
          } catch {
            failed = true;
          }
        }
        queued -= bytes;
      });
    };
    const finish = async (): Promise<void> => {
      await queue;
      if (handle) await (await handle.catch(() => null))?.close().catch(() => (failed = true));
    };
    const copy: SpoolCopy = {
      async *tee(body) {
        let gathered: Uint8Array[] = [];
        let bytes = 0;
        for await (const chunk of body) {
          if (!failed) {
            gathered.push(chunk);
            bytes += chunk.byteLength;
            if (written + queued + bytes > options.maxBytes)
              failed = true; // no bigger than the whole budget
            else if (bytes >= WRITE_BYTES) {
              write(gathered, bytes);
              gathered = [];
              bytes = 0;
              if (queued > MAX_QUEUED) await queue; // the disk bounds memory, not the network
            }
          }
          yield chunk;
        }
        if (!failed && bytes > 0) write(gathered, bytes);
      },
      async keep(hex, stored) {
        await finish();
        if (closed || failed || written !== stored || stored < MIN_SPOOLED_BYTES || !handle) return copy.drop();
        const d = await directory();
        const target = path.join(d, `${hex}-${name}`);
        try {
          await rename(file, target);
        } catch {
          return copy.drop();
        }
        if (closed) return void (await rm(target, { force: true }).catch(() => undefined));
        admit(hex, { file: target, size: stored, at: Date.now() });
      },
      async drop() {
        failed = true;
        await finish();
        if (file) await rm(file, { force: true }).catch(() => undefined);
      },
    };
    return copy;
  }

  function sizeOf(hex: string): number | null {
    const entry = entries.get(hex);
    if (!entry) return null;
    if (Date.now() - entry.at > maxAge) {
      forget(hex, entry);
      return null;
    }
    return entry.size;
  }

  /** The copy of `hex` opened, or null (a copy whose file is gone is forgotten). */
  async function openCopy(hex: string): Promise<{ fh: FileHandle; entry: Entry } | null> {
    const entry = entries.get(hex);
    if (!entry) return null;
    try {
      return { fh: await open(entry.file, "r"), entry };
    } catch {
      if (entries.get(hex) === entry) forget(hex, entry);
      return null;
    }
  }

  async function read(hex: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null> {
    const opened = await openCopy(hex);
    if (!opened) return null;
    const { fh, entry } = opened;
    // The descriptor keeps the bytes readable even if the copy is evicted meanwhile.
    return fh.createReadStream({
      start: range?.start ?? 0,
      end: Math.min(range?.end ?? entry.size - 1, entry.size - 1),
      highWaterMark: WRITE_BYTES,
    });
  }

  // A commit hashes a large item through this (archive.ts, borrowed reads): fresh 1 MiB buffers per read cost a
  // page fault a page, about as much as the hash itself.
  async function openReader(hex: string): Promise<BlobReader | null> {
    const opened = await openCopy(hex);
    if (!opened) return null;
    const { fh, entry } = opened;
    return {
      size: entry.size,
      async read(buffer, offset, length, position) {
        if (position >= entry.size) return 0;
        const want = Math.min(length, entry.size - position);
        return (await fh.read(buffer, offset, want, position)).bytesRead;
      },
      close: () => fh.close(),
    };
  }

  return {
    begin,
    sizeOf,
    read,
    open: openReader,
    forget(hex) {
      const entry = entries.get(hex);
      if (entry) forget(hex, entry);
    },
    async close() {
      closed = true;
      entries.clear();
      total = 0;
      const made = dir ? await dir.catch(() => "") : "";
      if (!made) return;
      liveDirs.delete(made);
      await rm(made, { recursive: true, force: true }).catch(() => undefined);
    },
  };
}
