/**
 * Commit attempts and whether the process running one is still alive.
 * Why: docs/decisions/depot-catalog.md, "attempts.ts: telling dead commit attempts".
 */
import { randomUUID } from "node:crypto";
import { hostname } from "node:os";

/** How long a commit attempt counts as running when its owner cannot be checked (another host). */
const COMMIT_LEASE_MS = 10 * 60 * 1000;

const INCARNATION = randomUUID();
const HOST = hostname();
const running = new Set<string>();

/** A new attempt id naming this process, registered as running until {@link endAttempt}. */
export function startAttempt(): string {
  const id = `${encodeURIComponent(HOST)}|${process.pid}|${INCARNATION}|${randomUUID()}`;
  running.add(id);
  return id;
}

/** Marks an attempt of this process finished (it succeeded, failed or gave up). */
export function endAttempt(id: string): void {
  running.delete(id);
}

/** Whether the attempt `id`, started at `startedAt` (ms), may still be running at `nowMs`. */
export function attemptAlive(id: string, startedAt: number, nowMs: number): boolean {
  const [host, pidText, incarnation] = id.split("|");
  if (incarnation === INCARNATION) return running.has(id);
  if (host !== undefined && pidText !== undefined && incarnation !== undefined && safeDecode(host) === HOST) {
    const pid = Number(pidText);
    if (pid === process.pid || !Number.isSafeInteger(pid) || pid <= 0) return false;
    if (!processExists(pid)) return false;
  }
  return startedAt > nowMs - COMMIT_LEASE_MS;
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** The attempts of a `commitAttempts` map (id → start, ms) that may still be running at `nowMs`. */
export function liveAttempts(attempts: Record<string, number> | undefined, nowMs: number): Record<string, number> {
  return Object.fromEntries(
    Object.entries(attempts ?? {}).filter(([id, startedAt]) => attemptAlive(id, startedAt, nowMs)),
  );
}
