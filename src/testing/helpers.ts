/** Small builders the conformance suites use, exported for hosts' own adapter tests. */
import { createHash, randomUUID } from "node:crypto";
import type { JobResult, LogEntry } from "../runner/ports.js";

/** A complete job result with fresh IDs; override any field. */
export function sampleJobResult(overrides: Partial<JobResult> = {}): JobResult {
  const now = new Date();
  return {
    requestId: randomUUID(),
    outcome: "finished",
    exitCode: 0,
    success: true,
    repoUrl: "https://git.example.com/team/app.git",
    commitSha: "0123456789abcdef0123456789abcdef01234567",
    lines: { stdout: 3, stderr: 1 },
    logTruncated: false,
    startedAt: new Date(now.getTime() - 1000).toISOString(),
    endedAt: now.toISOString(),
    ...overrides,
  };
}

/** The log entry one runner line leaves when stored whole. */
export function logEntry(line: string, stderr = false): LogEntry {
  return { stored: [{ line, stderr }], stderr, bytes: Buffer.byteLength(line, "utf8") };
}

/** `sha256:<hex>` of some bytes. */
export function sha256Digest(bytes: Uint8Array | string): string {
  return `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
}

/** Deterministic pseudo-random bytes (xorshift), so a failure can be reproduced. */
export function patternBytes(size: number, seed = 1): Buffer {
  const out = Buffer.allocUnsafe(size);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

/** An async body yielding `bytes` in pieces of `chunkSize`. */
export async function* chunked(bytes: Uint8Array, chunkSize = 64 * 1024): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < bytes.byteLength; i += chunkSize) {
    yield bytes.subarray(i, Math.min(bytes.byteLength, i + chunkSize));
  }
}

/** An async body that yields `before` bytes of `bytes` and then throws (a client that hung up). */
export async function* brokenBody(
  bytes: Uint8Array,
  before: number,
  chunkSize = 64 * 1024,
): AsyncGenerator<Uint8Array> {
  for await (const chunk of chunked(bytes.subarray(0, before), chunkSize)) yield chunk;
  throw new Error("body broke off");
}

/** Reads an async byte stream to one Buffer. */
export async function collectBytes(body: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of body) parts.push(Buffer.from(chunk));
  return Buffer.concat(parts);
}

/** Reads an async iterable to an array. */
export async function collectAll<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/** Resolves after `ms`; for polling a back door, never for asserting on time. */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
