/**
 * The fs log store's open log files: a job's log stays open while it is appended to, so an
 * append is a positional write and a datasync on the pool, not also an open and a close;
 * at most {@link MAX_OPEN_LOGS} per directory stay open between appends, least recently
 * appended closed first, so a fleet of jobs cannot run the process out of descriptors.
 */
import { closeSync, fdatasync, openSync, write } from "node:fs";
import { promisify } from "node:util";

const writeAt = promisify(write);
const syncData = promisify(fdatasync);

/**
 * Log files a directory's store keeps open between appends (least recently appended
 * closed first): a descriptor each, so a fleet of jobs cannot run the process out of them.
 * Appends in flight hold one each beyond it while they write (as every append did before
 * files were kept open); the excess is closed as they end.
 */
export const MAX_OPEN_LOGS = 64;

/** A job's log file as the pool sees it. */
export interface LogHandle {
  /** The job, as the pool's key. */
  readonly id: string;
  /** The log file's path. */
  readonly path: string;
  /** The descriptor while the file is kept open. */
  fd?: number;
  /** True while an append writes through `fd` (it is then never closed under it). */
  writing?: boolean;
}

/**
 * The open log files of one directory (shared by the stores on it in a process).
 *
 * @example
 * const logs = new OpenLogs();
 * await logs.write(handle, bytes, offset, true, offset === 0);
 * logs.close(handle);
 */
export class OpenLogs {
  /** Handles whose file is open, least recently appended first (Map order). */
  private readonly open = new Map<string, LogHandle>();

  /**
   * Writes `bytes` at `at` in the handle's file (created when `fresh`) and, with `sync`, datasyncs it: two pool trips.
   */
  async write(handle: LogHandle, bytes: Buffer, at: number, sync: boolean, fresh: boolean): Promise<void> {
    handle.writing = true;
    try {
      const fd = this.fdOf(handle, fresh);
      let written = 0;
      while (written < bytes.length)
        written += (await writeAt(fd, bytes, written, bytes.length - written, at + written)).bytesWritten;
      if (sync) await syncData(fd);
    } catch (error) {
      // A failed write or sync: the next append opens the file anew.
      this.close(handle);
      throw error;
    } finally {
      handle.writing = false;
      this.trim();
    }
  }

  /** Closes the handle's file if it is kept open. O(1). */
  close(handle: LogHandle): void {
    if (handle.fd === undefined) return;
    const fd = handle.fd;
    handle.fd = undefined;
    this.open.delete(handle.id);
    try {
      closeSync(fd);
    } catch {
      // Already closed by the system (EBADF cannot happen otherwise): nothing to release.
    }
  }

  /** Closes every kept file. O(open). */
  closeAll(): void {
    for (const handle of [...this.open.values()]) this.close(handle);
  }

  /** The handle's file, open for positional writes (kept open). O(1) amortised. */
  private fdOf(handle: LogHandle, fresh: boolean): number {
    if (handle.fd !== undefined) {
      // Most recently appended goes last.
      this.open.delete(handle.id);
      this.open.set(handle.id, handle);
      return handle.fd;
    }
    handle.fd = openSync(handle.path, fresh ? "w" : "r+");
    this.open.set(handle.id, handle);
    this.trim();
    return handle.fd;
  }

  /**
   * Closes the least recently appended files not being written until at most MAX_OPEN_LOGS are open.
   * Why: docs/decisions/runner-server.md, "log-descriptors.ts: OpenLogs.trim".
   */
  private trim(): void {
    for (const other of this.open.values()) {
      if (this.open.size <= MAX_OPEN_LOGS) return;
      if (!other.writing) this.close(other);
    }
  }
}
