/**
 * Archived job logs in a directory: the embedded default of {@link LogArchiveStore}. An
 * object is written to a temporary file, synced and renamed into place, so a reader sees a
 * whole object or none; ranged reads are positional reads of the file.
 */
import { randomBytes } from "node:crypto";
import { open, readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { RunnerDepotError } from "../../errors.js";
import type { LogArchiveStore } from "../../runner/ports.js";
import { createDirectorySync } from "./durable.js";
import { openIfExists } from "./files.js";

/** Options of {@link createFsLogArchive}. */
export interface FsLogArchiveOptions {
  /** Sync each object (and the directory) before it counts as stored; default true. */
  fsync?: boolean;
}

const KEY = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/;
const TMP = ".tmp";

function pathOf(dir: string, key: string): string {
  if (!KEY.test(key) || key.endsWith(TMP))
    throw new RunnerDepotError("INVALID_ARGUMENT", `not an archive key: ${JSON.stringify(key.slice(0, 64))}`);
  return join(dir, key);
}

/**
 * Creates a {@link LogArchiveStore} in `dir` (created when missing).
 *
 * @example
 * const logs = createArchivingLogStore(createFsLogStore("/var/lib/ci/logs"), {
 *   archive: createFsLogArchive("/var/lib/ci/log-archive"),
 * });
 */
export function createFsLogArchive(dir: string, options: FsLogArchiveOptions = {}): LogArchiveStore {
  const sync = options.fsync ?? true;
  // The log store drops a job's lines once its archive is put: the put's rename (and the
  // directory's own entry, when it was made) must be on disk by then, so a failed directory
  // fsync fails the put. A filesystem that cannot fsync a directory is tolerated (durable.ts).
  // A put is rare (one a job): one-shot handles, none kept.
  // isClosed always: an owner with no close of its own keeps no handle (every fsync opens its own).
  const dirs = createDirectorySync({ sync, isClosed: () => true });
  let made: Promise<unknown> | null = null;
  const ready = () => {
    made ??= dirs.makeDir(dir);
    // A failed mkdir or fsync is tried again by the next call.
    made.catch(() => (made = null));
    return made;
  };
  const syncDir = () => dirs.fsyncDir(dir);

  return {
    async put(key, body) {
      const target = pathOf(dir, key);
      await ready();
      const tmp = `${target}.${randomBytes(6).toString("hex")}${TMP}`;
      const fh = await open(tmp, "w");
      let done = false;
      try {
        let position = 0;
        for await (const chunk of body) {
          let written = 0;
          while (written < chunk.byteLength) {
            const out = await fh.write(chunk, written, chunk.byteLength - written, position + written);
            written += out.bytesWritten;
          }
          position += chunk.byteLength;
        }
        if (sync) await fh.sync();
        done = true;
      } finally {
        await fh.close();
        if (!done) await rm(tmp, { force: true });
      }
      await rename(tmp, target);
      if (sync) await syncDir();
    },

    async read(key, start, end) {
      const path = pathOf(dir, key);
      const fh = await openIfExists(path);
      if (!fh) return null;
      try {
        const out = Buffer.allocUnsafe(Math.max(0, end - start));
        let got = 0;
        while (got < out.length) {
          const { bytesRead } = await fh.read(out, got, out.length - got, start + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
        return got === out.length ? out : out.subarray(0, got);
      } finally {
        await fh.close();
      }
    },

    async delete(key) {
      await rm(pathOf(dir, key), { force: true });
    },

    async prune(before) {
      // O(objects held): a readdir and a stat each; run it rarely (the archiving store does).
      await ready();
      let count = 0;
      for (const name of await readdir(dir)) {
        const path = join(dir, name);
        const info = await stat(path).catch(() => null);
        if (!info?.isFile() || info.mtimeMs >= before.getTime()) continue;
        await rm(path, { force: true });
        if (!name.endsWith(TMP)) count++;
      }
      return count;
    },
  };
}
