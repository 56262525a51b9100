/**
 * The depot client's downloads: an archive or a delta streamed to a sink, resumed with
 * Range/If-Range after a broken transfer, never read past its announced size, and checked
 * against the server's Repr-Digest before it is made visible.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { digestToHex, hexToDigest } from "./http.js";
import { yankedReason } from "./yank.js";
import { seg, specPath, versionPart, type DepotConnection } from "./connection.js";
import type { DownloadOptions, DownloadResult } from "./types.js";
import { openSink, overrun, Overrun } from "./download-sink.js";

/** Answers worth another try: the depot or a proxy in front of it is briefly unavailable. */
const RETRY_STATUS = new Set([502, 503, 504]);

/**
 * Streams `/data/<spec>` (or the delta from `opts.from`) to `opts.to`, verifying and resuming.
 *
 * @example
 * const got = await downloadArchive(createDepotConnection({ baseUrl }), "toolchain@1.4.0", { to: "./toolchain.tar" });
 */
export async function downloadArchive(
  connection: DepotConnection,
  spec: string,
  opts: DownloadOptions = {},
): Promise<DownloadResult> {
  const { url, headersWith, fetch: fetchImpl, retries, sleep, limits } = connection;
  const { name, version } = versionPart(spec);
  const relative = dataPath(name, version, opts.from);
  const sink = await openSink(opts.to, `${name}-${version ?? "latest"}`);
  let target = url(relative);
  const depotOrigin = new URL(target).origin;
  let hash = createHash("sha256");
  let received = 0;
  let total: number | undefined;
  let etag: string | null = null;
  let expected: string | null = null;
  let resumes = 0;
  let yanked: string | undefined;
  let idle = 0; // attempts in a row without a byte of progress
  try {
    for (;;) {
      const headers = headersWith();
      // A resume goes to the redirect's target (a signed blob URL): the depot's token is the depot's alone, as fetch
      // itself drops it on a redirect to another origin.
      if (new URL(target).origin !== depotOrigin) headers.delete("authorization");
      if (received > 0) {
        headers.set("range", `bytes=${received}-`);
        if (etag) headers.set("if-range", etag);
      }
      let response: Response;
      // The answer must begin within the idle bound, like each chunk after it.
      const answer = new AbortController();
      const timer = connection.boundsHeaders ? setTimeout(() => answer.abort(), limits.idleTimeoutMs) : undefined;
      const signal = opts.signal ? AbortSignal.any([opts.signal, answer.signal]) : answer.signal;
      try {
        response = await fetchImpl(target, { headers, redirect: "follow", signal });
      } catch (cause) {
        if (opts.signal?.aborted || idle++ >= retries) {
          throw new RunnerDepotError("UNAVAILABLE", `cannot reach ${target}: ${fetchFailureCause(cause)}`, { cause });
        }
        await sleep(idle);
        continue;
      } finally {
        clearTimeout(timer);
      }
      if (RETRY_STATUS.has(response.status) && idle++ < retries) {
        await response.body?.cancel();
        await sleep(idle);
        continue;
      }
      if (response.status !== 200 && response.status !== 206) {
        throw await connection.error(response, `GET ${target}`);
      }
      const repr =
        response.headers.get("repr-digest") ??
        (response.status === 200 ? response.headers.get("content-digest") : null);
      const reprHex = repr ? digestToHex(repr) : null;
      const thisEtag = response.headers.get("etag");
      // Follow redirects once, then stick to the immutable URL for resumption.
      if (response.url) target = response.url;
      let restart = false;
      if (response.status === 206) {
        const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(response.headers.get("content-range") ?? "");
        const changed = (etag && thisEtag && thisEtag !== etag) || (expected && reprHex && reprHex !== expected);
        if (!m || Number(m[1]) !== received || changed) {
          await response.body?.cancel();
          throw new RunnerDepotError(
            "UNAVAILABLE",
            `GET ${target}: the server resumed at the wrong place or with another representation`,
          );
        }
        if (m[3] !== "*") total = Number(m[3]);
      } else {
        restart = received > 0; // the server ignored the range or the representation changed
        const length = response.headers.get("content-length");
        total = length === null ? undefined : Number(length);
      }
      if (restart) {
        if (!sink.restart) {
          await response.body?.cancel();
          throw new RunnerDepotError(
            "UNAVAILABLE",
            `GET ${target}: the server restarted the transfer and the target stream cannot rewind`,
          );
        }
        await sink.restart();
        hash = createHash("sha256");
        received = 0;
      }
      if (received === 0 || response.status === 200) {
        etag = thisEtag;
        expected = reprHex;
      }
      // The depot's answer says so (a signed-URL redirect's store does not: the first answer's header stands).
      yanked = yankedReason(response.headers) ?? yanked;
      if (received > 0) resumes++;
      const before = received;
      // The most this response may carry, whatever it streams: the announced size, the
      // body's own length, and the caller's cap. Nothing past it is written.
      const bound = Math.min(opts.expectedSize ?? Infinity, total ?? Infinity, opts.maxBytes ?? Infinity);
      if (opts.expectedSize !== undefined && total !== undefined && total !== opts.expectedSize) {
        await response.body?.cancel();
        throw new RunnerDepotError(
          "DIGEST_MISMATCH",
          `GET ${target}: the server announces ${total} bytes, the archive has ${opts.expectedSize}`,
        );
      }
      try {
        if (response.body) {
          for await (const chunk of connection.chunks(response.body, `GET ${target}`)) {
            if (received + chunk.byteLength > bound) throw overrun(target, received + chunk.byteLength, bound, opts);
            hash.update(chunk);
            await sink.write(chunk);
            received += chunk.byteLength;
            opts.onProgress?.({ received, total, resumes });
          }
        }
      } catch (cause) {
        if (opts.signal?.aborted || cause instanceof Overrun) {
          await response.body?.cancel().catch(() => undefined);
          throw cause instanceof Overrun ? cause.error : cause;
        }
        if (received > before) idle = 0;
        if (idle++ >= retries) {
          throw new RunnerDepotError(
            "UNAVAILABLE",
            `GET ${target}: transfer broken at ${received} bytes: ${(cause as Error).message}`,
            { cause },
          );
        }
        await sleep(0);
        continue;
      }
      if (total !== undefined && received < total) {
        // A body that ended early without an error (some proxies do that): resume.
        if (received > before) idle = 0;
        if (idle++ >= retries) {
          throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: transfer ended at ${received} of ${total} bytes`);
        }
        continue;
      }
      break;
    }
    const hex = hash.digest("hex");
    verify(target, hex, expected, received, total);
    const written = await sink.finish();
    return {
      url: target,
      digest: hexToDigest(hex),
      size: received,
      etag,
      resumes,
      ...(written ? { path: written } : {}),
      ...(yanked !== undefined ? { yanked } : {}),
    };
  } catch (error) {
    await sink.abort();
    throw error;
  }
}

/** The path of a version's archive, or of the delta to it from `from` (to the latest without a version). */
function dataPath(name: string, version: string | undefined, from: string | undefined): string {
  if (from === undefined) return `data/${specPath(name, version)}`;
  const fromVersion = versionPart(`${name}@${from}`).version!;
  return version ? `data/${seg(name)}/${seg(fromVersion)}/${seg(version)}` : `data/${seg(name)}/${seg(fromVersion)}`;
}

/** Refuses (DIGEST_MISMATCH) a finished transfer whose bytes are not the ones announced. */
function verify(
  target: string,
  hex: string,
  expected: string | null,
  received: number,
  total: number | undefined,
): void {
  if (!expected) {
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `GET ${target}: the server sent no Repr-Digest to verify the download against`,
    );
  }
  if (hex !== expected) {
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `GET ${target}: received sha256:${hex}, the server announced sha256:${expected}`,
      {
        details: { expected: hexToDigest(expected), actual: hexToDigest(hex) },
      },
    );
  }
  if (total !== undefined && received !== total) {
    throw new RunnerDepotError("DIGEST_MISMATCH", `GET ${target}: received ${received} bytes, expected ${total}`);
  }
}
