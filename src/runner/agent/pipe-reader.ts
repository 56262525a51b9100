/**
 * Reads a child's stdout or stderr pipe into one buffer reused for every read, instead of
 * the fresh 64 KiB buffer node allocates per read of a child's stdio: the fresh memory's
 * page faults and the mark-compacts its external memory drives were most of the agent's
 * reading cost. Why and figures: docs/decisions/ingest-limit.md, "pipe-reader.ts".
 */
import { Buffer } from "node:buffer";
import net from "node:net";
import type { Readable } from "node:stream";

/** Bytes of the reused read buffer: a pipe's default capacity on Linux, as node's own reads. */
export const PIPE_READ_BYTES = 64 * 1024;

/** What {@link readPipe} returns. */
export interface PipeReader {
  /** Stops reading (the child then blocks on its full pipe). */
  pause(): void;
  /** Reads again after {@link PipeReader.pause}. */
  resume(): void;
  /** Resolves once the pipe is closed and `onEnd` has run. */
  readonly done: Promise<void>;
  /** Whether reads go into the reused buffer (false: node's own reads, where its internals differ). */
  readonly reused: boolean;
}

/** The parts of node's pipe handle (PipeWrap) this uses; present since node 12. */
interface PipeHandle {
  reading: boolean;
  readStop(): number;
  useUserBuffer(buf: Uint8Array): void;
}

function adoptable(socket: Readable): PipeHandle | null {
  if (!(socket instanceof net.Socket)) return null;
  const handle = (socket as unknown as { _handle?: Partial<PipeHandle> | null })._handle;
  if (handle == null || typeof handle.readStop !== "function" || typeof handle.useUserBuffer !== "function")
    return null;
  // Anything read already sits in the socket's buffer; only a socket that has delivered nothing is taken over.
  if (socket.readableLength > 0 || socket.destroyed || socket.readableEnded) return null;
  return handle as PipeHandle;
}

/**
 * Reads `socket` (a child's stdio pipe, e.g. `child.stdout`) from now on: `onData` gets each
 * read, `onEnd` the end. The chunk `onData` gets is valid only during the call (its memory
 * takes the next read): copy what must outlive it. Call before the event loop runs after the
 * spawn, so no read has happened yet; a socket that already read is read the usual way.
 *
 * The pipe's handle moves to a socket made with `onread` (node's caller-owned read buffer;
 * it offers no other way for a child's stdio), and `socket` is closed without closing it:
 * the child's `close` event then no longer waits for the pipe, {@link PipeReader.done} does.
 *
 * @example
 * const out = readPipe(child.stdout!, (b) => split.push(b), () => split.end());
 * await Promise.all([exited, out.done]);
 */
export function readPipe(socket: Readable, onData: (chunk: Buffer) => void, onEnd: () => void): PipeReader {
  const handle = adoptable(socket);
  if (handle === null) return readStream(socket, onData, onEnd);
  handle.readStop();
  // The socket's own flag: left true, the new socket would think it reads already and never start.
  handle.reading = false;
  const buf = Buffer.allocUnsafe(PIPE_READ_BYTES);
  // `handle` is an option node's Socket takes (as child_process does) but its types leave out.
  const options: net.SocketConstructorOpts & { handle: PipeHandle } = {
    handle,
    readable: true,
    writable: false,
    onread: {
      buffer: buf,
      callback: (n: number) => {
        onData(buf.subarray(0, n));
        return true;
      },
    },
  };
  const reader = new net.Socket(options);
  (socket as unknown as { _handle: unknown })._handle = null;
  socket.destroy();
  return {
    pause: () => reader.pause(),
    resume: () => reader.resume(),
    done: ended(reader, onEnd),
    reused: true,
  };
}

/** The usual way: node's own reads (a fresh buffer each). */
function readStream(socket: Readable, onData: (chunk: Buffer) => void, onEnd: () => void): PipeReader {
  socket.on("data", onData);
  return {
    pause: () => socket.pause(),
    resume: () => socket.resume(),
    done: ended(socket, onEnd),
    reused: false,
  };
}

/** Runs `onEnd` once at the end of the data (or at a read error, which ends it too) and resolves at the close. */
function ended(socket: Readable, onEnd: () => void): Promise<void> {
  let over = false;
  const end = () => {
    if (over) return;
    over = true;
    onEnd();
  };
  socket.on("end", end);
  // A read error (rare on a pipe) ends the output like its end would; it must not crash the agent.
  socket.on("error", end);
  return new Promise((resolve) => {
    socket.once("close", () => {
      end();
      resolve();
    });
  });
}
