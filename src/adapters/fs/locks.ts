/**
 * Record locks of the fs store. Work on one key is serialised inside a process by a
 * per-key promise chain (`withKey`), so the lock file (`withLock`) only arbitrates between
 * processes sharing the directory on one host or a POSIX filesystem. A lock file is created
 * whole by hard-linking the process's owner file; a lock left by a killed process is broken
 * when its owner is gone (same host: the pid is dead or belongs to a new incarnation) or it
 * is older than `staleLockMs`.
 */
import { randomUUID } from "node:crypto";
import { linkSync } from "node:fs";
import { link, readFile, rename, stat, unlink, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { dirname, join } from "node:path";
import { RunnerDepotError } from "../../errors.js";
import type { FsStoreContext } from "./context.js";
import { unlinkQuietly } from "./files.js";

/** Tells this process's locks from those of an earlier process that had the same pid. */
const INCARNATION = randomUUID();
const HOST = hostname();
/** How often a process renews the file its locks link (see `ownerFile`). */
const OWNER_RENEW_MS = 5_000;
/** The longest wait between two tries at a held lock (the wait doubles from 1 ms). */
const MAX_RETRY_DELAY_MS = 50;

/** Lock timings of one store (see FsStoreOptions). */
export interface LockOptions {
  staleLockMs: number;
  lockTimeoutMs: number;
}

/** The locking operations of one fs store (see {@link createLocks}). */
export interface RecordLocks {
  /** Runs `work` after every earlier work on `key` in this process settled. O(1) to queue. */
  withKey<T>(key: string, work: () => Promise<T>): Promise<T>;
  /** Runs `work` holding `<file>.lock`, waiting up to lockTimeoutMs for it (then UNAVAILABLE). */
  withLock<T>(file: string, work: () => Promise<T>): Promise<T>;
  /** Waits for every work queued by withKey to settle (the store's close). */
  drain(): Promise<void>;
  /** Removes the owner file (the store's close, after drain). */
  releaseOwner(): Promise<void>;
}

/** Makes the locks of one store: its key chains and its owner file. */
export function createLocks(ctx: FsStoreContext, options: LockOptions): RecordLocks {
  const chains = new Map<string, Promise<unknown>>();
  const owner = createOwnerFile(ctx);

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
    const deadline = Date.now() + options.lockTimeoutMs;
    let delay = 1;
    for (;;) {
      if (await takeLock(lock)) break;
      // A retry after a break is bounded by the same deadline: a break that keeps failing
      // must not spin for ever.
      if ((await breakIfStale(ctx, lock, options.staleLockMs)) && Date.now() <= deadline) continue;
      if (Date.now() > deadline) throw new RunnerDepotError("UNAVAILABLE", "Timed out waiting for a record lock");
      // Randomised exponential backoff: waiters on one key do not retry in step.
      await new Promise((resolve) => setTimeout(resolve, delay + Math.random() * delay));
      delay = Math.min(delay * 2, MAX_RETRY_DELAY_MS);
    }
    try {
      return await work();
    } finally {
      unlinkQuietly(lock);
    }
  }

  /** Creates the lock file as a hard link of the owner file (inline, see durable.ts); true when taken, false when held. */
  async function takeLock(lock: string): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      const { path } = await owner.get(attempt > 0);
      try {
        linkSync(path, lock);
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

  async function drain(): Promise<void> {
    await Promise.allSettled([...chains.values()]);
  }

  return { withKey, withLock, drain, releaseOwner: owner.release };
}

/**
 * The lock content of this process, written once to a temp file that every lock of the
 * process hard-links: taking a lock is one `link` (whole from the first instant) instead
 * of writing a temp file per lock. The file is renewed every OWNER_RENEW_MS so a lock's
 * mtime (which is the shared file's) is never much older than the lock itself, keeping
 * the age rule for other hosts' locks; lock judges read the pid and incarnation.
 */
function createOwnerFile(ctx: FsStoreContext): {
  get(renew?: boolean): Promise<{ path: string; content: string }>;
  release(): Promise<void>;
} {
  let owner: { path: string; content: string; at: number } | undefined;

  async function get(renew = false): Promise<{ path: string; content: string }> {
    if (!renew && owner && Date.now() - owner.at < OWNER_RENEW_MS) return owner;
    const previous = owner;
    const content = JSON.stringify({ pid: process.pid, host: HOST, incarnation: INCARNATION, nonce: randomUUID() });
    // Named apart from uploads in flight, so a look at tmp/ can tell them (tests, operators).
    const path = ctx.tmpPath("owner-");
    await writeFile(path, content, { flag: "wx" });
    owner = { path, content, at: Date.now() };
    if (previous) await unlink(previous.path).catch(() => undefined);
    return owner;
  }

  async function release(): Promise<void> {
    if (owner) await unlink(owner.path).catch(() => undefined);
  }

  return { get, release };
}

/** Breaks `lock` when its holder is gone or it is too old; true when the caller should retry at once. */
async function breakIfStale(ctx: FsStoreContext, lock: string, staleLockMs: number): Promise<boolean> {
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
  // Move it aside first, then check we moved the lock we judged, not a fresh one. The
  // aside name is short and beside the lock (same directory, so the rename is atomic): a
  // name built on the lock's own could pass the 255-byte limit for a long key segment.
  const aside = join(dirname(lock), `${randomUUID()}.stale`);
  try {
    await rename(lock, aside);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return true; // released meanwhile
    throw error;
  }
  const moved = await readFile(aside, "utf8").catch(() => null);
  if (moved !== content) {
    // We took a live lock by mistake: put it back unless someone already re-took the name.
    await createWhole(ctx, lock, moved ?? "").catch(() => undefined);
  }
  await unlink(aside).catch(() => undefined);
  return true;
}

/**
 * Creates `path` with `content` only if it does not exist, never leaving it empty or
 * half-written: the content is written to a temp file first and hard-linked into place
 * (link fails atomically when the name is taken). True when created.
 */
async function createWhole(ctx: FsStoreContext, path: string, content: string): Promise<boolean> {
  const tmp = ctx.tmpPath();
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

/** Whether a lock holder on this host still runs: its pid answers signal 0 (EPERM: alive, not ours). */
function ownerAlive(pid: number, incarnation: string | undefined): boolean {
  if (pid === process.pid) return incarnation === INCARNATION;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}
