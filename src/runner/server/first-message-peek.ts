/**
 * The request ID of a compressed first message, read from its first few decompressed
 * bytes only, so that a call's token is checked before the message is decompressed
 * (docs/decisions/runner-server.md, "Compressed first messages").
 */
import * as zlib from "node:zlib";

/** Decompressed bytes read to find the request ID: a UUID's field (38 bytes) with room for any spelling of it. */
export const PEEK_BYTES = 256;

/**
 * Up to `PEEK_BYTES` of `payload` decompressed with `encoding` (only "gzip": a brotli
 * decoder fills its ring buffer, up to the sender's 16 MiB window, before it yields any
 * output, so brotli requests are not accepted at all), or fewer when the message is
 * shorter; null for any other encoding. The stream is destroyed after its first output
 * chunk (`chunkSize` PEEK_BYTES), so the work is a few such chunks whatever the message
 * expands to. Rejects on corrupt input.
 */
export function peekDecompressed(encoding: string, payload: Uint8Array): Promise<Buffer> | null {
  if (encoding !== "gzip") return null;
  const stream = zlib.createGunzip({ chunkSize: PEEK_BYTES });
  return new Promise<Buffer>((resolve, reject) => {
    const parts: Buffer[] = [];
    let got = 0;
    const done = () => {
      stream.removeAllListeners("data");
      stream.destroy();
      resolve(Buffer.concat(parts).subarray(0, PEEK_BYTES));
    };
    stream.on("data", (chunk: Buffer) => {
      parts.push(chunk);
      got += chunk.length;
      if (got >= PEEK_BYTES) done();
    });
    stream.once("end", done);
    stream.once("error", (error) => {
      stream.destroy();
      reject(error);
    });
    stream.end(payload);
  });
}

/**
 * The `request_id` (field 1, a string) of a LogItem whose encoding starts with `bytes`,
 * when that field comes first and lies wholly within them; otherwise null. Serializers
 * write fields in number order, so field 1 comes first. O(bytes).
 */
export function requestIdAtStart(bytes: Uint8Array): string | null {
  // Tag of field 1, wire type 2 (length-delimited).
  if (bytes.length < 2 || bytes[0] !== 0x0a) return null;
  let length = 0;
  let at = 1;
  for (let shift = 0; ; shift += 7) {
    if (at >= bytes.length || shift > 21) return null;
    const b = bytes[at++]!;
    length |= (b & 0x7f) << shift;
    if ((b & 0x80) === 0) break;
  }
  if (at + length > bytes.length) return null;
  return Buffer.from(bytes.buffer, bytes.byteOffset + at, length).toString("utf8");
}
