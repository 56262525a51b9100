/**
 * A TCP proxy for HTTP/2 (h2c) tests that rewrites what the client sends: every DATA
 * frame becomes one-byte DATA frames (END_STREAM kept on the last), so an ordinary
 * node:http2 client can send the "one byte per DATA frame" floods of the attacks in
 * issue 9 (node's own client coalesces small writes into large frames).
 */
import * as net from "node:net";
import type { AddressInfo } from "node:net";

const PREFACE = 24;
const DATA = 0x0;
const END_STREAM = 0x1;
const PADDED = 0x8;

/** A running proxy. */
export interface FrameSplittingProxy {
  url: string;
  /** DATA frames written towards the server. */
  readonly dataFrames: number;
  close(): Promise<void>;
}

/** Starts a proxy in front of `target` (`host:port`) that splits DATA frames into `pieceBytes`-byte frames (default 1). */
export async function startFrameSplittingProxy(targetPort: number, pieceBytes = 1): Promise<FrameSplittingProxy> {
  let dataFrames = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, "127.0.0.1");
    sockets.add(client).add(upstream);
    client.on("close", () => sockets.delete(client));
    upstream.on("close", () => sockets.delete(upstream));
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    upstream.pipe(client);
    let pending: Buffer = Buffer.alloc(0);
    let prefaceLeft = PREFACE;
    client.on("data", (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      const out: Buffer[] = [];
      if (prefaceLeft > 0) {
        const take = Math.min(prefaceLeft, pending.length);
        out.push(pending.subarray(0, take));
        pending = pending.subarray(take);
        prefaceLeft -= take;
      }
      while (pending.length >= 9) {
        const length = pending.readUIntBE(0, 3);
        if (pending.length < 9 + length) break;
        const type = pending[3]!;
        const flags = pending[4]!;
        const frame = pending.subarray(0, 9 + length);
        pending = pending.subarray(9 + length);
        if (type !== DATA || (flags & PADDED) !== 0 || length <= pieceBytes) {
          if (type === DATA) dataFrames++;
          out.push(frame);
          continue;
        }
        // One frame per piece: 9 header bytes + the piece, END_STREAM only on the last.
        const pieces = Math.ceil(length / pieceBytes);
        const split = Buffer.allocUnsafe(pieces * 9 + length);
        let pos = 0;
        for (let i = 0; i < pieces; i++) {
          const start = 9 + i * pieceBytes;
          const n = Math.min(pieceBytes, length - i * pieceBytes);
          split.writeUIntBE(n, pos, 3);
          split[pos + 3] = DATA;
          split[pos + 4] = i === pieces - 1 ? flags & END_STREAM : 0;
          split.writeUInt32BE(frame.readUInt32BE(5), pos + 5);
          frame.copy(split, pos + 9, start, start + n);
          pos += 9 + n;
        }
        dataFrames += pieces;
        out.push(split);
      }
      if (out.length > 0) upstream.write(out.length === 1 ? out[0]! : Buffer.concat(out));
    });
    client.on("end", () => upstream.end());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    get dataFrames() {
      return dataFrames;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
