/** The process's file-descriptor limit and use, read from /proc on Linux (issue 30 item 3). */
import { readFileSync } from "node:fs";
import { readdir } from "node:fs/promises";

/** The soft `Max open files` limit, or null where /proc/self/limits is not there (not Linux). */
export function descriptorLimit(): number | null {
  try {
    const line = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync("/proc/self/limits", "utf8"));
    return line && line[1] !== "unlimited" ? Number(line[1]) : null;
  } catch {
    return null;
  }
}

/** Descriptors open now (an O(descriptors) directory read), or null off Linux. */
export async function descriptorsInUse(): Promise<number | null> {
  try {
    return (await readdir("/proc/self/fd")).length;
  } catch {
    return null;
  }
}

/**
 * The connection cap that leaves descriptors for the store, the logs and the backends:
 * `wanted`, at most three quarters of the limit (with 1,024 descriptors: 768).
 */
export function connectionCapFor(wanted: number, limit: number | null = descriptorLimit()): number {
  return limit === null ? wanted : Math.max(1, Math.min(wanted, Math.floor((limit * 3) / 4)));
}

/** Rejects (code `DESCRIPTORS_SHORT`) when more than nine tenths of the limit are open: for /readyz. */
export async function checkDescriptors(limit: number | null = descriptorLimit()): Promise<void> {
  const used = await descriptorsInUse();
  if (limit === null || used === null) return;
  if (used > (limit * 9) / 10)
    throw Object.assign(new Error(`${used} of ${limit} file descriptors are open`), { code: "DESCRIPTORS_SHORT" });
}
