/**
 * Test helpers for directory fsyncs: the fs stores fsync a directory through
 * FileHandle#sync (files through fd calls), so replacing that one method on the
 * FileHandle prototype sees, holds or fails every directory fsync of the process.
 */
import { readlinkSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";

/** An fs error as the system gives it. */
export const errno = (code: string) => Object.assign(new Error(`${code}: injected, fsync`), { code, syscall: "fsync" });

/**
 * Replaces FileHandle#sync of directories with `fake`, given the original and the directory's
 * path (from /proc/self/fd; "?" without /proc); a file's sync goes through. Returns the undo.
 */
export async function replaceDirSync(fake: (original: () => Promise<void>, path: string) => Promise<void>): Promise<() => void> {
  const probe = await open(tmpdir(), "r");
  const proto = Object.getPrototypeOf(probe) as { sync: () => Promise<void> };
  await probe.close();
  const original = proto.sync;
  proto.sync = function (this: { fd: number }) {
    let path = "?";
    try {
      path = readlinkSync(`/proc/self/fd/${this.fd}`);
      if (!statSync(path).isDirectory()) return original.call(this);
    } catch {
      // No /proc: the path is only for the tests' messages and counts.
    }
    return fake(() => original.call(this), path);
  };
  return () => {
    proto.sync = original;
  };
}

/** Makes every directory fsync fail with `code` while `failing()`; returns the undo. */
export function failDirSync(code: string, failing: () => boolean): Promise<() => void> {
  return replaceDirSync((original, path) =>
    failing() ? Promise.reject(Object.assign(new Error(`${code}: injected, fsync ${path}`), { code, syscall: "fsync" })) : original(),
  );
}
