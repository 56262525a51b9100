/**
 * Bounded reads of a depot's answers: every body the client reads stops at a byte bound
 * (decoded bytes, so a gzip bomb inflates no further than the bound), an idle-time bound
 * between chunks, and for small JSON bodies a total-time bound. See docs/decisions/depot-client.md.
 */
import { RunnerDepotError } from "../../errors.js";

/** The bounds of one body. */
export interface BodyLimits {
  /** Decoded bytes read at most. */
  maxBytes: number;
  /** The longest wait for the next chunk, in ms. */
  idleMs: number;
  /** The longest the whole body may take, in ms (none when absent). */
  totalMs?: number;
}

/** The client's defaults (DepotClientOptions documents each). */
export const DEFAULT_LIMITS = {
  maxJsonBytes: 32 * 2 ** 20,
  maxErrorBytes: 64 * 2 ** 10,
  idleTimeoutMs: 30_000,
  jsonTimeoutMs: 120_000,
  maxCatalogPages: 10_000,
  maxCatalogBytes: 128 * 2 ** 20,
} as const;

const timedOut = (what: string, ms: number, kind: "idle" | "total") =>
  new RunnerDepotError(
    "DEADLINE_EXCEEDED",
    kind === "idle"
      ? `${what}: no byte of the answer for ${ms / 1000} s`
      : `${what}: the answer took longer than ${ms / 1000} s`,
    { details: { timeout: kind, ms } },
  );

/**
 * The chunks of `body`, failing with DEADLINE_EXCEEDED when the next one
 * takes longer than `idleMs`, or the whole body longer than `totalMs`. The body is
 * cancelled when the iteration stops early, for whatever reason.
 *
 * @example
 * for await (const chunk of timedChunks(response.body!, "GET /data/x", { idleMs: 30_000 })) sink.write(chunk);
 */
export async function* timedChunks(
  body: ReadableStream<Uint8Array>,
  what: string,
  limits: { idleMs: number; totalMs?: number },
): AsyncGenerator<Uint8Array> {
  const reader = body.getReader();
  const deadline = limits.totalMs === undefined ? Infinity : Date.now() + limits.totalMs;
  let finished = false;
  try {
    for (;;) {
      const left = deadline - Date.now();
      const idle = left < limits.idleMs;
      const wait = Math.max(0, Math.min(limits.idleMs, left));
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(idle ? timedOut(what, limits.totalMs!, "total") : timedOut(what, limits.idleMs, "idle")),
          wait,
        );
      });
      let step: ReadableStreamReadResult<Uint8Array>;
      try {
        step = await Promise.race([reader.read(), timeout]);
      } finally {
        clearTimeout(timer);
      }
      if (step.done) {
        finished = true;
        return;
      }
      yield step.value;
    }
  } finally {
    // A stalled or over-long body: release the socket rather than wait for it.
    if (!finished) void reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

/**
 * A body's bytes up to `limits.maxBytes`. Past it the body is cancelled and, with
 * `truncate`, what came so far is answered with `truncated`; otherwise TOO_LARGE.
 *
 * @example
 * const { bytes } = await readBounded(response, "GET /version/x", { maxBytes: 2 ** 20, idleMs: 30_000 });
 */
export async function readBounded(
  response: Pick<Response, "body">,
  what: string,
  limits: BodyLimits,
  truncate = false,
): Promise<{ bytes: Buffer; truncated: boolean }> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (response.body) {
    for await (const chunk of timedChunks(response.body, what, limits)) {
      if (size + chunk.byteLength > limits.maxBytes) {
        if (!truncate) {
          throw new RunnerDepotError("TOO_LARGE", `${what}: the answer is larger than ${limits.maxBytes} bytes`, {
            details: { maxBytes: limits.maxBytes },
          });
        }
        chunks.push(chunk.subarray(0, limits.maxBytes - size));
        return { bytes: Buffer.concat(chunks), truncated: true };
      }
      size += chunk.byteLength;
      chunks.push(chunk);
    }
  }
  return { bytes: Buffer.concat(chunks), truncated: false };
}

/** A JSON body read within `limits`; an answer that is not JSON is UNAVAILABLE naming the request. */
export async function readJson<T>(response: Response, what: string, limits: BodyLimits): Promise<T> {
  const { bytes } = await readBounded(response, what, limits);
  return parseJson<T>(bytes, what);
}

/** `bytes` as JSON; UNAVAILABLE naming the request when they are not. */
export function parseJson<T>(bytes: Buffer, what: string): T {
  try {
    return JSON.parse(bytes.toString("utf8")) as T;
  } catch (cause) {
    throw new RunnerDepotError("UNAVAILABLE", `${what}: the answer is not JSON`, { cause });
  }
}
