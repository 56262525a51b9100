/**
 * The filesystem PackageStore: the depot's embedded default.
 *
 * Layout under `dir`:
 * - `blobs/sha256/<2 hex>/<64 hex>`: content-addressed blobs, immutable once renamed in;
 * - `records/<seg>/…/<last seg>~`: one JSON file per record key (`{ key, revision, value }`),
 *   segments percent-encoded so any key maps to a safe name;
 * - `tmp/`: files being written; a kill leaves at most an orphan here, never a torn blob or record.
 *
 * Guarantees: every blob and record appears whole or not at all (write to `tmp/`, fsync,
 * rename, fsync the directory). Compare-and-swap is exact between concurrent calls in one
 * process (a per-key promise chain) and between processes sharing `dir` on one host or a
 * POSIX filesystem (a per-key lock file, created whole by hard-linking a written temp
 * file, held only for the read-compare-rename; a create-only write needs none: it
 * hard-links its written temp file into place, which fails when the name exists).
 * A lock left by a killed process is broken when its owner is gone (same host: the pid is
 * dead or belongs to a new incarnation) or it is older than `staleLockMs`.
 */
import { createHash, randomUUID } from "node:crypto";
import { constants as fsConstants } from "node:fs";
import { link, mkdir, open, readdir, readFile, rename, rm, stat, unlink, writeFile, type FileHandle } from "node:fs/promises";
import { hostname } from "node:os";
import { join } from "node:path";
import type { BlobInfo, BlobReader, ByteRange, PackageStore, PutBlobOptions, StoredRecord } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";

/** Options of {@link createFsStore}. */
export interface FsStoreOptions {
  /** A lock older than this is broken whoever holds it (default 30 s; a critical section lasts milliseconds). */
  staleLockMs?: number;
  /** How long a compare-and-swap waits for a key's lock before failing UNAVAILABLE (default 30 s). */
  lockTimeoutMs?: number;
  /** Skip fsync (tests on tmpfs only; a crash may then lose acknowledged writes). */
  unsafeNoSync?: boolean;
}

const DIGEST_RE = /^sha256:([0-9a-f]{64})$/;
const SAFE_SEGMENT_CHAR = /[A-Za-z0-9._@+=-]/;
const MAX_ENCODED_SEGMENT = 240;
const INCARNATION = randomUUID();
/** Bytes gathered before one write to a blob's temp file. */
const WRITE_BYTES = 1024 * 1024;
/**
 * Bytes written to a blob between background flushes to disk (fdatasync) while it is still
 * arriving, so the fsync before the rename finds little left to write. On this host a
 * 256 MiB file took 1.5 s to write and fsync at the end, 0.9 s with a flush every 32 MiB
 * (the disk works while the socket does).
 */
const FLUSH_BYTES = 32 * 1024 * 1024;
/** Directory handles kept open for fsyncs (see `syncDirNow`). */
const DIR_HANDLES = 64;
/** The first read of a record file: most records fit, so a read is open, read, close. */
const RECORD_READ_BYTES = 16 * 1024;
/** Chunk size of blob reads (fewer, larger chunks to the socket; bounded memory per download). */
const READ_BYTES = 256 * 1024;
const HOST = hostname();
/** How often a process renews the file its locks link (see `ownerFile`). */
const OWNER_RENEW_MS = 5_000;

/**
 * Creates a PackageStore in a directory (created when missing). Blobs are not signable, so
 * the depot streams them itself.
 *
 * @example
 * const depot = createPackageRouter(createFsStore("/var/lib/depot"));
 */
export function createFsStore(dir: string, options: FsStoreOptions = {}): PackageStore {
  const staleLockMs = options.staleLockMs ?? 30_000;
  const lockTimeoutMs = options.lockTimeoutMs ?? 30_000;
  const sync = !options.unsafeNoSync;
  const blobsDir = join(dir, "blobs", "sha256");
  const recordsDir = join(dir, "records");
  const tmpDir = join(dir, "tmp");
  const chains = new Map<string, Promise<unknown>>();
  let ready: Promise<void> | undefined;
  let closed = false;

  function init(): Promise<void> {
    if (closed) return Promise.reject(new RunnerDepotError("UNAVAILABLE", "The fs store is closed"));
    ready ??= (async () => {
      await mkdir(blobsDir, { recursive: true });
      await mkdir(recordsDir, { recursive: true });
      await mkdir(tmpDir, { recursive: true });
      // Orphans of killed writers; another live process may be writing fresh ones.
      for (const name of await readdir(tmpDir)) {
        const path = join(tmpDir, name);
        const info = await stat(path).catch(() => null);
        if (info && Date.now() - info.mtimeMs > 3_600_000) await rm(path, { force: true });
      }
    })();
    return ready;
  }

  /**
   * Directory fsyncs in flight, per directory. A caller needs a sync that starts after its
   * rename, so it joins the queued one (or queues one) behind a sync already running:
   * concurrent writers into one directory (`records/trans`, `records/pkg`, a sequence
   * shard) share one fsync instead of one each (group commit).
   */
  const dirSyncs = new Map<string, { running: Promise<void>; queued?: Promise<void> }>();

  function fsyncDir(path: string): Promise<void> {
    if (!sync) return Promise.resolve();
    const state = dirSyncs.get(path);
    if (!state) {
      const running = syncDirNow(path).finally(() => settleDirSync(path, running));
      dirSyncs.set(path, { running });
      return running;
    }
    state.queued ??= state.running.catch(() => undefined).then(() => syncDirNow(path));
    return state.queued;
  }

  function settleDirSync(path: string, finished: Promise<void>): void {
    const state = dirSyncs.get(path);
    if (!state || state.running !== finished) return;
    if (!state.queued) {
      dirSyncs.delete(path);
      return;
    }
    const running = state.queued.finally(() => settleDirSync(path, running));
    running.catch(() => undefined);
    dirSyncs.set(path, { running });
  }

  /**
   * Open handles of recently synced directories (most recent last), so a directory fsync
   * is one call, not open, fsync and close: the few directories every publish writes
   * (`records/trans`, `records/pkg`, a sequence shard, blob shards) stay open. At most
   * DIR_HANDLES; FileHandle.close waits for a sync still running on the handle.
   */
  const dirHandles = new Map<string, Promise<FileHandle>>();

  async function syncDirNow(path: string): Promise<void> {
    if (closed) {
      const once = await open(path, fsConstants.O_RDONLY);
      await once.sync().finally(() => once.close());
      return;
    }
    let handle = dirHandles.get(path);
    if (handle) dirHandles.delete(path);
    else {
      const opening = open(path, fsConstants.O_RDONLY);
      opening.catch(() => {
        if (dirHandles.get(path) === opening) dirHandles.delete(path);
      });
      handle = opening;
    }
    dirHandles.set(path, handle);
    if (dirHandles.size > DIR_HANDLES) {
      const [oldest, evicted] = dirHandles.entries().next().value as [string, Promise<FileHandle>];
      dirHandles.delete(oldest);
      void evicted.then((h) => h.close()).catch(() => undefined);
    }
    await (await handle).sync();
  }

  /** Record directories known to exist: a write skips its mkdir (directories are never removed while open). */
  const madeDirs = new Set<string>();
  async function ensureDir(path: string): Promise<void> {
    if (madeDirs.has(path)) return;
    await mkdir(path, { recursive: true });
    if (madeDirs.size > 100_000) madeDirs.clear();
    madeDirs.add(path);
  }

  /** A fresh name in `tmp/`; `kind` marks files that are not an upload or record in flight. */
  function tmpPath(kind = ""): string {
    return join(tmpDir, `${kind}${process.pid}-${randomUUID()}`);
  }

  function blobPath(digest: string): string | null {
    const hex = DIGEST_RE.exec(digest)?.[1];
    return hex ? join(blobsDir, hex.slice(0, 2), hex) : null;
  }

  /** A stored blob opened for reading (getBlob, openBlob); null when it is not there (never stored, or collected). */
  async function openStoredBlob(digest: string): Promise<FileHandle | null> {
    await init();
    const path = blobPath(digest);
    if (!path) return null;
    try {
      return await open(path, "r");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw error;
    }
  }

  function recordPath(key: string): string {
    const segments = key.split("/").map(encodeSegment);
    return join(recordsDir, ...segments.slice(0, -1), `${segments.at(-1)}~`);
  }

  /** Serialises work on one key inside this process, so the lock file only arbitrates between processes. */
  function withKey<T>(key: string, work: () => Promise<T>): Promise<T> {
    const previous = chains.get(key) ?? Promise.resolve();
    const run = previous.then(work, work);
    const tail = run.catch(() => undefined);
    chains.set(key, tail);
    void tail.then(() => {
      if (chains.get(key) === tail) chains.delete(key);
    });
    return run;
  }

  /**
   * The lock content of this process, written once to a temp file that every lock of the
   * process hard-links: taking a lock is one `link` (whole from the first instant) instead
   * of writing a temp file per lock. The file is renewed every OWNER_RENEW_MS so a lock's
   * mtime (which is the shared file's) is never much older than the lock itself, keeping
   * the age rule for other hosts' locks; lock judges read the pid and incarnation.
   */
  let owner: { path: string; content: string; at: number } | undefined;
  async function ownerFile(renew = false): Promise<{ path: string; content: string }> {
    if (!renew && owner && Date.now() - owner.at < OWNER_RENEW_MS) return owner;
    const previous = owner;
    const content = JSON.stringify({ pid: process.pid, host: HOST, incarnation: INCARNATION, nonce: randomUUID() });
    // Named apart from uploads in flight, so a look at tmp/ can tell them (tests, operators).
    const path = tmpPath("owner-");
    await writeFile(path, content, { flag: "wx" });
    owner = { path, content, at: Date.now() };
    if (previous) await unlink(previous.path).catch(() => undefined);
    return owner;
  }

  /** Creates the lock file as a hard link of the owner file; true when taken, false when held. */
  async function takeLock(lock: string): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      const { path } = await ownerFile(attempt > 0);
      try {
        await link(path, lock);
        return true;
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === "EEXIST") return false;
        // The owner file went (another process's temp cleanup): write a new one, once.
        // (ENOENT with the owner file in place: the lock's directory is missing.)
        if (code !== "ENOENT" || attempt > 0 || (await stat(path).then(() => true, () => false))) throw error;
      }
    }
  }

  async function withLock<T>(file: string, work: () => Promise<T>): Promise<T> {
    const lock = `${file}.lock`;
    const deadline = Date.now() + lockTimeoutMs;
    let delay = 1;
    for (;;) {
      if (await takeLock(lock)) break;
      if (await breakIfStale(lock)) continue;
      if (Date.now() > deadline) throw new RunnerDepotError("UNAVAILABLE", "Timed out waiting for a record lock");
      await new Promise((resolve) => setTimeout(resolve, delay + Math.random() * delay));
      delay = Math.min(delay * 2, 50);
    }
    try {
      return await work();
    } finally {
      await unlink(lock).catch(() => undefined);
    }
  }

  async function breakIfStale(lock: string): Promise<boolean> {
    const [content, info] = await Promise.all([readFile(lock, "utf8").catch(() => null), stat(lock).catch(() => null)]);
    if (content === null || info === null) return true; // released meanwhile: retry at once
    let holder: { pid?: number; host?: string; incarnation?: string } = {};
    try {
      holder = JSON.parse(content) as typeof holder;
    } catch {
      // A lock file torn by a kill between create and write: judge by age alone.
    }
    const stale = Date.now() - info.mtimeMs > staleLockMs || (holder.host === HOST && typeof holder.pid === "number" && !ownerAlive(holder.pid, holder.incarnation));
    if (!stale) return false;
    // Move it aside first, then check we moved the lock we judged, not a fresh one.
    const aside = `${lock}.${randomUUID()}.stale`;
    try {
      await rename(lock, aside);
    } catch {
      return true;
    }
    const moved = await readFile(aside, "utf8").catch(() => null);
    if (moved !== content) {
      // We took a live lock by mistake: put it back unless someone already re-took the name.
      await createWhole(lock, moved ?? "").catch(() => undefined);
    }
    await unlink(aside).catch(() => undefined);
    return true;
  }

  /**
   * Creates `path` with `content` only if it does not exist, never leaving it empty or
   * half-written: the content is written to a temp file first and hard-linked into place
   * (link fails atomically when the name is taken). True when created.
   */
  async function createWhole(path: string, content: string): Promise<boolean> {
    const tmp = tmpPath();
    await writeFile(tmp, content, { flag: "wx" });
    try {
      await link(tmp, path);
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw error;
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
  }

  function ownerAlive(pid: number, incarnation: string | undefined): boolean {
    if (pid === process.pid) return incarnation === INCARNATION;
    try {
      process.kill(pid, 0);
      return true;
    } catch (error) {
      return (error as NodeJS.ErrnoException).code === "EPERM";
    }
  }

  /**
   * Reads a record file: open, one read, close for a record under RECORD_READ_BYTES (most
   * are), where `readFile` also asks the size first and reads again to see the end. A
   * regular file's read returns fewer bytes than asked only at its end.
   */
  async function readRecordFile(file: string): Promise<{ key: string; revision: string; value: unknown } | null> {
    let handle: FileHandle;
    try {
      handle = await open(file, "r");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw error;
    }
    try {
      let buffer = Buffer.allocUnsafe(RECORD_READ_BYTES);
      let length = 0;
      for (;;) {
        const { bytesRead } = await handle.read(buffer, length, buffer.length - length, length);
        length += bytesRead;
        if (bytesRead === 0 || length < buffer.length) break;
        const larger = Buffer.allocUnsafe(buffer.length * 4);
        buffer.copy(larger, 0, 0, length);
        buffer = larger;
      }
      return JSON.parse(buffer.toString("utf8", 0, length)) as { key: string; revision: string; value: unknown };
    } finally {
      await handle.close();
    }
  }

  /** Writes a new file whole and (unless unsafeNoSync) flushes it to disk. */
  async function writeSynced(path: string, data: string | Uint8Array): Promise<void> {
    const handle = await open(path, "wx");
    try {
      await handle.writeFile(data);
      if (sync) await handle.sync();
    } finally {
      await handle.close();
    }
  }

  async function writeAtomically(file: string, data: string | Uint8Array): Promise<void> {
    const tmp = tmpPath();
    await writeSynced(tmp, data);
    try {
      await rename(tmp, file);
    } catch (error) {
      await rm(tmp, { force: true });
      throw error;
    }
  }

  return {
    async putBlob(body: AsyncIterable<Uint8Array>, opts: PutBlobOptions = {}): Promise<BlobInfo> {
      await init();
      const tmp = tmpPath();
      const hash = createHash("sha256");
      let size = 0;
      let handle: FileHandle | undefined = await open(tmp, "wx");
      try {
        // Socket chunks (often 16–64 KiB) are gathered into writes of up to WRITE_BYTES,
        // one syscall per MiB, and one write stays in flight while the next MiB is read
        // and hashed, so the disk and the socket work at the same time.
        let pending: Uint8Array[] = [];
        let pendingBytes = 0;
        let writing: Promise<unknown> = Promise.resolve();
        // One background fdatasync at a time, started every FLUSH_BYTES written.
        let flushing: Promise<unknown> = Promise.resolve();
        let unflushed = 0;
        const flush = async () => {
          await writing;
          unflushed += pendingBytes;
          writing = handle!.writev(pending);
          writing.catch(() => undefined); // awaited below; never an unhandled rejection
          pending = [];
          pendingBytes = 0;
          if (sync && unflushed >= FLUSH_BYTES) {
            await flushing;
            unflushed = 0;
            const written = writing;
            flushing = written.then(() => handle!.datasync());
            flushing.catch(() => undefined);
          }
        };
        try {
          for await (const chunk of body) {
            size += chunk.byteLength;
            if (opts.maxBytes !== undefined && size > opts.maxBytes) {
              throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
            }
            hash.update(chunk);
            pending.push(chunk);
            pendingBytes += chunk.byteLength;
            if (pendingBytes >= WRITE_BYTES) await flush();
          }
          if (pendingBytes > 0) await flush();
        } finally {
          await writing.catch(() => undefined);
          await flushing.catch(() => undefined);
        }
        await writing;
        await flushing;
        if (sync) await handle.sync();
        await handle.close();
        handle = undefined;
        const digest = `sha256:${hash.digest("hex")}`;
        if (opts.expectedDigest !== undefined && opts.expectedDigest !== digest) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${opts.expectedDigest}`);
        }
        const final = blobPath(digest)!;
        await ensureDir(join(final, ".."));
        await rename(tmp, final);
        await fsyncDir(join(final, ".."));
        return { digest, size };
      } catch (error) {
        await handle?.close().catch(() => undefined);
        await rm(tmp, { force: true });
        throw error;
      }
    },

    async getBlob(digest: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null> {
      const handle = await openStoredBlob(digest);
      if (!handle) return null;
      // The open handle keeps the bytes readable even if the blob is collected meanwhile.
      return handle.createReadStream({ start: range?.start, end: range?.end, autoClose: true, highWaterMark: READ_BYTES });
    },

    async openBlob(digest: string): Promise<BlobReader | null> {
      const handle = await openStoredBlob(digest);
      if (!handle) return null;
      try {
        const { size } = await handle.stat();
        // pread(2) into the caller's buffer: no allocation per read, unlike a read stream.
        return {
          size,
          read: async (buffer, offset, length, position) => (await handle.read(buffer, offset, length, position)).bytesRead,
          close: () => handle.close(),
        };
      } catch (error) {
        await handle.close().catch(() => undefined);
        throw error;
      }
    },

    async statBlob(digest: string) {
      await init();
      const path = blobPath(digest);
      if (!path) return null;
      const info = await stat(path).catch(() => null);
      return info ? { size: info.size } : null;
    },

    async deleteBlob(digest: string) {
      await init();
      const path = blobPath(digest);
      if (path) await rm(path, { force: true });
    },

    async *listBlobs() {
      await init();
      for (const shard of (await readdir(blobsDir)).sort()) {
        const names = await readdir(join(blobsDir, shard)).catch(() => [] as string[]);
        for (const name of names.sort()) if (/^[0-9a-f]{64}$/.test(name)) yield `sha256:${name}`;
      }
    },

    async getRecord<T>(key: string): Promise<StoredRecord<T> | null> {
      await init();
      const record = await readRecordFile(recordPath(key));
      return record ? { value: record.value as T, revision: record.revision } : null;
    },

    async putRecord(key: string, value: unknown, cond: { ifRevision: string | null; lazy?: boolean }) {
      await init();
      const file = recordPath(key);
      const json = JSON.stringify(value);
      if (json === undefined) throw new RunnerDepotError("BAD_REQUEST", "Record value is not JSON");
      const dir = join(file, "..");
      await ensureDir(dir);
      const content = (revision: string) => `{"key":${JSON.stringify(key)},"revision":"${revision}","value":${json}}`;
      if (cond.ifRevision === null) {
        // Create-only needs no lock and no read: the file is written whole under a temp
        // name and hard-linked into place, and link(2) fails when the name exists. A
        // compare-and-swap or delete in another process holds the lock only while the
        // record exists, so it cannot interleave with a create that succeeds.
        return withKey(key, async () => {
          const revision = randomUUID();
          const tmp = tmpPath();
          try {
            await writeSynced(tmp, content(revision));
            await link(tmp, file);
          } catch (error) {
            if ((error as NodeJS.ErrnoException).code === "EEXIST") return null;
            throw error;
          } finally {
            await unlink(tmp).catch(() => undefined);
          }
          if (!cond.lazy) await fsyncDir(dir);
          return revision;
        });
      }
      return withKey(key, () =>
        withLock(file, async () => {
          const current = await readRecordFile(file);
          if ((current?.revision ?? null) !== cond.ifRevision) return null;
          const revision = randomUUID();
          // The file's bytes are always synced before the rename (never a torn record after
          // a machine crash); a lazy write skips only the directory's fsync.
          await writeAtomically(file, content(revision));
          if (!cond.lazy) await fsyncDir(dir);
          return revision;
        }),
      );
    },

    async deleteRecord(key: string, cond?: { ifRevision: string | null; lazy?: boolean }) {
      await init();
      const file = recordPath(key);
      return withKey(key, () =>
        withLock(file, async () => {
          const current = await readRecordFile(file);
          if (!current) return false;
          if (cond && cond.ifRevision !== null && cond.ifRevision !== current.revision) return false;
          await unlink(file);
          if (!cond?.lazy) await fsyncDir(join(file, ".."));
          return true;
        }).catch((error) => {
          if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
          throw error;
        }),
      );
    },

    async listRecords(prefix: string, page: { cursor?: string; limit?: number } = {}) {
      await init();
      const parts = prefix.split("/");
      const base = join(recordsDir, ...parts.slice(0, -1).map(encodeSegment));
      const keys: string[] = [];
      const walk = async (path: string, keyPrefix: string): Promise<void> => {
        let entries;
        try {
          entries = await readdir(path, { withFileTypes: true });
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code === "ENOENT" || (error as NodeJS.ErrnoException).code === "ENOTDIR") return;
          throw error;
        }
        for (const entry of entries) {
          if (entry.isDirectory()) {
            await walk(join(path, entry.name), `${keyPrefix}${decodeSegment(entry.name)}/`);
          } else if (entry.name.endsWith("~")) {
            const key = keyPrefix + decodeSegment(entry.name.slice(0, -1));
            if (key.startsWith(prefix)) keys.push(key);
          }
        }
      };
      await walk(base, parts.slice(0, -1).map((p) => `${p}/`).join(""));
      // A directory cannot be read from a cursor on, so every page walks the whole prefix:
      // O(keys) per page. What it sorts is only the keys after the cursor, each encoded
      // once (not twice per comparison): a caller wanting every key asks for one large page
      // (records.ts `allKeys`) and pays O(keys log keys) once, not once per 1,000 keys.
      const after = page.cursor === undefined ? undefined : Buffer.from(page.cursor);
      const candidates: Array<{ key: string; bytes: Buffer }> = [];
      for (const key of keys) {
        const bytes = Buffer.from(key);
        if (after === undefined || Buffer.compare(bytes, after) > 0) candidates.push({ key, bytes });
      }
      candidates.sort((a, b) => Buffer.compare(a.bytes, b.bytes));
      const limit = page.limit ?? 1000;
      const slice = candidates.slice(0, limit).map((c) => c.key);
      return candidates.length > limit ? { keys: slice, cursor: slice.at(-1)! } : { keys: slice };
    },

    async close() {
      closed = true;
      await Promise.allSettled([...chains.values()]);
      const handles = [...dirHandles.values()];
      dirHandles.clear();
      await Promise.allSettled(handles.map(async (h) => (await h).close()));
      if (owner) await unlink(owner.path).catch(() => undefined);
    },
  };
}

/** Percent-encodes a key segment into a file name: no '/', no leading '.', no '~', bounded length. */
function encodeSegment(segment: string): string {
  if (segment === "") return "%";
  let out = "";
  for (const [i, ch] of [...segment].entries()) {
    if (SAFE_SEGMENT_CHAR.test(ch) && !(i === 0 && ch === ".")) out += ch;
    else for (const byte of Buffer.from(ch, "utf8")) out += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  if (out.length > MAX_ENCODED_SEGMENT) {
    throw new RunnerDepotError("BAD_REQUEST", `Record key segment too long for the fs store: ${segment.slice(0, 40)}…`);
  }
  return out;
}

function decodeSegment(name: string): string {
  return name === "%" ? "" : decodeURIComponent(name);
}
