/**
 * The fs log store's job state files (`<id>.json`): the atomic replace that commits a change, and the scan of the
 * jobs directory at open that reads every state and settles what a crash left beside them (torn log ends, orphan
 * logs, temp files, tail files no state names). Why: docs/decisions/runner-server.md, "log-store.ts (fs): a log file
 * and a state file per job".
 */
import { closeSync, fsync, openSync, renameSync, writeSync } from "node:fs";
import { mkdir, readdir, readFile, rm, truncate } from "node:fs/promises";
import { promisify } from "node:util";
import { join } from "node:path";
import { normalizeRequestId } from "../../runner/protocol/request-id.js";
import type { createDirectorySync } from "./durable.js";
import { unlinkQuietly } from "./files.js";
import { isTailFile, settleTailFiles, type TailRecord } from "./log-tail-file.js";

const syncAll = promisify(fsync);

/** The jobs directory of a store, and how its changes reach the disk. */
export interface StateFiles {
  jobsDir: string;
  sync: boolean;
  dirs: ReturnType<typeof createDirectorySync>;
}

/** What a state file holds that the scan reads: the log file's valid bytes and the tail files it names. */
export interface StoredState extends TailRecord {
  requestId: string;
  fileBytes: number;
}

/**
 * Replaces job `state.requestId`'s state file with `state` once `before` (the log's write and sync) has succeeded.
 * Why: docs/decisions/runner-server.md, "log-state-file.ts: commitStateFile".
 *
 * @example
 * await commitStateFile(files, next, backend.openLogs.write(job, bytes, at, true, at === 0));
 */
export async function commitStateFile(files: StateFiles, state: StoredState, before: Promise<void>): Promise<void> {
  const target = join(files.jobsDir, `${state.requestId}.json`);
  const tmp = `${target}.${process.pid}.tmp`;
  let fd: number | undefined;
  try {
    fd = openSync(tmp, "w");
    const text = Buffer.from(JSON.stringify(state), "utf8");
    for (let done = 0; done < text.length;) done += writeSync(fd, text, done, text.length - done);
    const synced = files.sync ? syncAll(fd) : Promise.resolve();
    // Both settle before anything is closed or renamed (no promise left unobserved).
    const [log, own] = await Promise.allSettled([before, synced]);
    if (log.status === "rejected") throw log.reason;
    if (own.status === "rejected") throw own.reason;
  } catch (error) {
    if (fd !== undefined) closeSync(fd);
    unlinkQuietly(tmp);
    // The caller's own work may still be running when opening the temp file failed.
    await before.catch(() => undefined);
    throw error;
  }
  closeSync(fd);
  renameSync(tmp, target);
  // The rename, and a log file's creation (same directory), reach the disk only with the
  // directory's own fsync: without it a machine crash could bring back the old state,
  // which counts fewer items than `committed` acknowledged. Concurrent appends share one
  // (group commit), so it costs one pool trip per batch, not per job.
  if (files.sync) await files.dirs.fsyncDir(files.jobsDir);
}

/**
 * Opens the jobs directory (made when missing): hands every job's state to `found` and removes what no state
 * names. O(files).
 *
 * @example
 * await scanJobsDir(files, (id, state) => jobs.set(id, newJob(id, state)), (id) => jobs.get(id)?.state);
 */
export async function scanJobsDir<S extends StoredState>(
  files: StateFiles,
  found: (id: string, state: S) => void,
  stateOf: (id: string) => S | undefined,
): Promise<void> {
  const { jobsDir, sync } = files;
  const logPath = (id: string) => join(jobsDir, `${id}.log`);
  // The jobs directory's entry (and its parents', when they were made too) is synced
  // once here: a crash after the first acknowledged append could otherwise lose it.
  if (sync) await files.dirs.makeDir(jobsDir);
  else await mkdir(jobsDir, { recursive: true });
  const logs: string[] = [];
  const tailNames: string[] = [];
  for (const name of await readdir(jobsDir)) {
    if (isTailFile(name)) {
      tailNames.push(name);
      continue;
    }
    if (name.endsWith(".tmp")) {
      await rm(join(jobsDir, name), { force: true });
      continue;
    }
    if (name.endsWith(".log")) logs.push(name.slice(0, -4));
    if (!name.endsWith(".json")) continue;
    const id = name.slice(0, -5);
    if (normalizeRequestId(id) !== id) continue;
    const state = JSON.parse(await readFile(join(jobsDir, name), "utf8")) as S;
    // Drop a torn tail left by a crash between the log write and the state write.
    await truncate(logPath(id), state.fileBytes).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "ENOENT") throw error;
    });
    found(id, state);
  }
  // A log without a state is what a crash in prune() leaves (its state was removed,
  // durably, before its log): nothing else names it, so it goes. A job's first state
  // is durable before its log file is made, so a live job's log never looks so.
  for (const id of logs) {
    if (normalizeRequestId(id) === id && !stateOf(id)) await rm(logPath(id), { force: true });
  }
  // Tail files the states do not name (dropped, or their job gone) go (listed ones were written and synced
  // before the state naming them was renamed in).
  await settleTailFiles(jobsDir, tailNames, stateOf);
  // The jobs directory itself, once an open: a process that died between a state's
  // rename and its directory fsync left a rename only the page cache holds, and this
  // store answers from it (a call replaying lines already stored writes nothing, so
  // syncs nothing): a machine crash could then take back a committed count acknowledged.
  if (sync) await files.dirs.fsyncDir(jobsDir);
}
