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
 * file, held only for the read-compare-rename).
 * A lock left by a killed process is broken when its owner is gone (same host: the pid is
 * dead or belongs to a new incarnation) or it is older than `staleLockMs`.
 */
import { createHash, randomUUID } from "node:crypto";
import { constants as fsConstants } from "node:fs";
import { link, mkdir, open, readdir, readFile, rename, rm, stat, unlink, writeFile, type FileHandle } from "node:fs/promises";
import { hostname } from "node:os";
import { join } from "node:path";
import type { BlobInfo, ByteRange, PackageStore, PutBlobOptions, StoredRecord } from "../../depot/ports.js";
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
const HOST = hostname();

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

  async function fsyncDir(path: string): Promise<void> {
    if (!sync) return;
    const handle = await open(path, fsConstants.O_RDONLY);
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
  }

  function tmpPath(): string {
    return join(tmpDir, `${process.pid}-${randomUUID()}`);
  }

  function blobPath(digest: string): string | null {
    const hex = DIGEST_RE.exec(digest)?.[1];
    return hex ? join(blobsDir, hex.slice(0, 2), hex) : null;
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

  async function withLock<T>(file: string, work: () => Promise<T>): Promise<T> {
    const lock = `${file}.lock`;
    const owner = JSON.stringify({ pid: process.pid, host: HOST, incarnation: INCARNATION, nonce: randomUUID() });
    const deadline = Date.now() + lockTimeoutMs;
    let delay = 1;
    for (;;) {
      if (await createWhole(lock, owner)) break;
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

  async function readRecordFile(file: string): Promise<{ key: string; revision: string; value: unknown } | null> {
    try {
      return JSON.parse(await readFile(file, "utf8")) as { key: string; revision: string; value: unknown };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw error;
    }
  }

  async function writeAtomically(file: string, data: string | Uint8Array): Promise<void> {
    const tmp = tmpPath();
    const handle = await open(tmp, "wx");
    try {
      await handle.writeFile(data);
      if (sync) await handle.sync();
    } finally {
      await handle.close();
    }
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
        for await (const chunk of body) {
          size += chunk.byteLength;
          if (opts.maxBytes !== undefined && size > opts.maxBytes) {
            throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
          }
          hash.update(chunk);
          await handle.write(chunk);
        }
        if (sync) await handle.sync();
        await handle.close();
        handle = undefined;
        const digest = `sha256:${hash.digest("hex")}`;
        if (opts.expectedDigest !== undefined && opts.expectedDigest !== digest) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${opts.expectedDigest}`);
        }
        const final = blobPath(digest)!;
        await mkdir(join(final, ".."), { recursive: true });
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
      await init();
      const path = blobPath(digest);
      if (!path) return null;
      let handle: FileHandle;
      try {
        handle = await open(path, "r");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw error;
      }
      // The open handle keeps the bytes readable even if the blob is collected meanwhile.
      return handle.createReadStream({ start: range?.start, end: range?.end, autoClose: true });
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

    async putRecord(key: string, value: unknown, cond: { ifRevision: string | null }) {
      await init();
      const file = recordPath(key);
      const json = JSON.stringify(value);
      if (json === undefined) throw new RunnerDepotError("BAD_REQUEST", "Record value is not JSON");
      await mkdir(join(file, ".."), { recursive: true });
      return withKey(key, () =>
        withLock(file, async () => {
          const current = await readRecordFile(file);
          if ((current?.revision ?? null) !== cond.ifRevision) return null;
          const revision = randomUUID();
          await writeAtomically(file, `{"key":${JSON.stringify(key)},"revision":"${revision}","value":${json}}`);
          await fsyncDir(join(file, ".."));
          return revision;
        }),
      );
    },

    async deleteRecord(key: string, cond?: { ifRevision: string | null }) {
      await init();
      const file = recordPath(key);
      return withKey(key, () =>
        withLock(file, async () => {
          const current = await readRecordFile(file);
          if (!current) return false;
          if (cond && cond.ifRevision !== null && cond.ifRevision !== current.revision) return false;
          await unlink(file);
          await fsyncDir(join(file, ".."));
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
      const sorted = keys
        .filter((k) => page.cursor === undefined || Buffer.compare(Buffer.from(k), Buffer.from(page.cursor)) > 0)
        .sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
      const limit = page.limit ?? 1000;
      const slice = sorted.slice(0, limit);
      return sorted.length > limit ? { keys: slice, cursor: slice.at(-1)! } : { keys: slice };
    },

    async close() {
      closed = true;
      await Promise.allSettled([...chains.values()]);
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
