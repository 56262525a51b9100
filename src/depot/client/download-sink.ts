/**
 * Where the depot client writes a download (a file, a Web stream or a Node stream), and
 * the bound no body may pass. Kept from the transfer loop (depot/client/download.ts) so the loop
 * reads as the protocol: ranges, resumption and verification.
 */
import { randomUUID } from "node:crypto";
import { open, rename, rm, type FileHandle } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Writable } from "node:stream";
import { RunnerDepotError } from "../../errors.js";
import type { DownloadOptions } from "./types.js";

/** Where a download's bytes go, rewound when the server restarts the transfer. */
interface Sink {
  write(chunk: Uint8Array): Promise<void>;
  /** Rewinds to zero bytes; absent when the target cannot rewind. */
  restart?(): Promise<void>;
  /** Makes the result visible; returns the file path, if any. */
  finish(): Promise<string | undefined>;
  abort(): Promise<void>;
}

/**
 * The sink for `to`: a path (written to `<path>.part`, renamed by `finish`, removed by
 * `abort`), a Web WritableStream, or a Node Writable.
 */
export async function openSink(to: DownloadOptions["to"], stem: string): Promise<Sink> {
  if (to === undefined || typeof to === "string") {
    const final = to ?? path.join(os.tmpdir(), `${stem}-${randomUUID()}.tar`);
    const part = `${final}.part`;
    const fh: FileHandle = await open(part, "w", 0o644);
    let position = 0;
    let closed = false;
    const close = async () => {
      if (!closed) {
        closed = true;
        await fh.close();
      }
    };
    return {
      async write(chunk) {
        let offset = 0;
        while (offset < chunk.byteLength) {
          const { bytesWritten } = await fh.write(chunk, offset, chunk.byteLength - offset, position);
          offset += bytesWritten;
          position += bytesWritten;
        }
      },
      async restart() {
        await fh.truncate(0);
        position = 0;
      },
      async finish() {
        // No fsync: a download lost in a crash is simply fetched again.
        await close();
        await rename(part, final);
        return final;
      },
      async abort() {
        await close().catch(() => undefined);
        await rm(part, { force: true });
      },
    };
  }
  if (typeof (to as WritableStream).getWriter === "function") {
    const writer = (to as WritableStream<Uint8Array>).getWriter();
    return {
      write: (chunk) => writer.write(chunk),
      async finish() {
        await writer.close();
        return undefined;
      },
      async abort() {
        await writer.abort().catch(() => undefined);
      },
    };
  }
  const stream = to as Writable;
  return {
    write: (chunk) =>
      new Promise<void>((resolve, reject) => {
        // The callback fires once the chunk is handed on, which is backpressure enough.
        stream.write(chunk, (error) => (error ? reject(error) : resolve()));
      }),
    async finish() {
      return undefined;
    },
    async abort() {
      // The caller owns the stream; leave it open but stop writing.
    },
  };
}

/** A body that went past its bound: carried out of the read loop, never retried. */
export class Overrun extends Error {
  constructor(readonly error: RunnerDepotError) {
    super(error.message);
  }
}

/** The error of a body past `bound`: TOO_LARGE under the caller's cap, DIGEST_MISMATCH past the announced size. */
export function overrun(target: string, got: number, bound: number, opts: DownloadOptions): Overrun {
  const capped = opts.maxBytes !== undefined && bound === opts.maxBytes && bound < (opts.expectedSize ?? Infinity);
  return new Overrun(
    capped
      ? new RunnerDepotError("TOO_LARGE", `GET ${target}: the body goes past ${bound} bytes (at least ${got}); stopped`)
      : new RunnerDepotError(
          "DIGEST_MISMATCH",
          `GET ${target}: the body goes past the ${bound} bytes announced (at least ${got}); stopped`,
        ),
  );
}
