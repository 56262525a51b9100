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
