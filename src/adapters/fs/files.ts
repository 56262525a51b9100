/**
 * File helpers shared by the fs adapters (package store, job log store, log archive).
 * Each is one or two syscalls: O(1).
 */
import { unlinkSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";

/** Opens `path` for reading; null when it does not exist (never written, or removed). */
export async function openIfExists(path: string): Promise<FileHandle | null> {
  try {
    return await open(path, "r");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
}

/**
 * Flushes a directory's entries to disk (a rename into it survives a crash), ignoring
 * failure: some platforms cannot fsync a directory, and the rename is still atomic. The
 * log adapters use it; the package store's directory fsyncs (durable.ts) must not fail
 * silently, since a publish is acknowledged only once durable.
 */
export async function syncDirBestEffort(dir: string): Promise<void> {
  let fh: FileHandle | undefined;
  try {
    fh = await open(dir, "r");
    await fh.sync();
  } catch {
    // Some platforms cannot fsync a directory; the rename is still atomic.
  } finally {
    await fh?.close();
  }
}

/**
 * Removes `path` inline (one unlink(2) on the calling thread), ignoring failure: the
 * callers drop a temp name or a lock that may already be gone. Inline because a round trip
 * through libuv's thread pool costs more CPU than the call (see durable.ts).
 */
export function unlinkQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // Already gone (or never made): nothing to drop.
  }
}
