/**
 * An embedded PostgreSQL for `npm test` on a machine without one: PGlite (PostgreSQL
 * compiled to WebAssembly) behind a wire-protocol server, in this child process so its
 * work never blocks vitest's own process. Prints `READY <url>` once it listens on
 * 127.0.0.1 (port chosen by the OS) and stops when its parent closes stdin or sends
 * SIGTERM.
 *
 * PGlite is one session, so every client connection is multiplexed onto it. The
 * multiplexer in @electric-sql/pglite-socket hands the session over between single
 * protocol messages, which lets two connections' extended-protocol exchanges
 * (Parse/Bind/Execute/Sync) interleave: one's Execute then finds the other's unnamed
 * portal ("portal \"\" does not exist"). This one hands it over only between whole
 * exchanges (up to a Sync or a simple Query) and, while a connection is inside a
 * transaction, runs nothing but that connection's exchanges. Concurrent transactions
 * are therefore serialised, never interleaved: every outcome is one that a real
 * PostgreSQL could also produce, but a row lock never makes anyone wait.
 */
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { PGlite } from "@electric-sql/pglite";

const SSL_REQUEST = 80877103;
const CANCEL_REQUEST = 80877102;
const PROTOCOL_3 = 196608;

/** One client exchange: the messages up to and including a Sync or a simple Query. */
interface Exchange {
  connection: Connection;
  messages: Uint8Array[];
}

interface Connection {
  id: number;
  socket: net.Socket;
  closed: boolean;
}

/**
 * A fresh data directory, just after initdb, kept between runs: PGlite's initdb takes
 * tens of seconds in WebAssembly, loading a saved one about a quarter of that. Keyed by
 * PGlite's version; `npm ci` clears it with node_modules.
 */
const modules = new URL("../../node_modules/", import.meta.url);
const pgliteVersion = (
  JSON.parse(await readFile(new URL("@electric-sql/pglite/package.json", modules), "utf8")) as { version: string }
).version;
const cache = join(fileURLToPath(new URL(".cache/runner-depot/", modules)), `pglite-${pgliteVersion}-initdb.tar.gz`);

async function openDatabase(): Promise<PGlite> {
  const saved = await readFile(cache).catch(() => null);
  if (saved) {
    try {
      return await PGlite.create({ loadDataDir: new Blob([saved]) });
    } catch {
      // A damaged cache: make a new one below.
    }
  }
  const fresh = await PGlite.create();
  try {
    const dump = Buffer.from(await (await fresh.dumpDataDir("gzip")).arrayBuffer());
    await mkdir(dirname(cache), { recursive: true });
    // Written whole, then renamed: a run that reads it never sees half a file.
    const partial = `${cache}.${process.pid}`;
    await writeFile(partial, dump);
    await rename(partial, cache);
  } catch {
    // No cache this time; the next run makes one.
  }
  return fresh;
}

const db = await openDatabase();

let nextId = 1;
const waiting: Exchange[] = [];
/** The connection whose transaction is open in the session, if any. */
let owner: Connection | null = null;
let running = false;

/** Runs waiting exchanges one at a time; while a transaction is open, only its owner's. */
async function drain(): Promise<void> {
  if (running) return;
  running = true;
  try {
    for (;;) {
      const index = owner ? waiting.findIndex((e) => e.connection === owner) : 0;
      if (index < 0 || waiting.length === 0) return;
      const [exchange] = waiting.splice(index, 1);
      try {
        await run(exchange!);
      } catch {
        // PGlite itself failed this exchange: the client cannot be answered in protocol.
        exchange!.connection.socket.destroy();
      }
    }
  } finally {
    running = false;
  }
}

async function run({ connection, messages }: Exchange): Promise<void> {
  if (connection.closed) return;
  for (const message of messages) {
    await db.execProtocolRawStream(message, {
      onRawData: (data) => {
        if (!connection.closed && data.length > 0) connection.socket.write(data);
      },
    });
  }
  owner = db.isInTransaction() ? connection : null;
}

/** A connection went away: drop what it queued and end a transaction it left open. */
async function release(connection: Connection): Promise<void> {
  if (connection.closed) return;
  connection.closed = true;
  for (let i = waiting.length - 1; i >= 0; i--) if (waiting[i]!.connection === connection) waiting.splice(i, 1);
  if (owner === connection) {
    // Wait for an exchange of this connection that is running now, then roll back.
    while (running) await new Promise((r) => setImmediate(r));
    if (owner === connection) {
      await db.exec("ROLLBACK").catch(() => {});
      owner = null;
    }
  }
  void drain();
}

function accept(socket: net.Socket): void {
  const connection: Connection = { id: nextId++, socket, closed: false };
  socket.setNoDelay(true);
  let buffer: Buffer = Buffer.alloc(0);
  let started = false;
  let pending: Uint8Array[] = [];
  socket.on("data", (data: Buffer) => {
    buffer = buffer.length ? Buffer.concat([buffer, data]) : data;
    for (;;) {
      if (!started) {
        // Untyped startup-phase packets: length (4) + code (4) + body.
        if (buffer.length < 8) return;
        const length = buffer.readInt32BE(0);
        if (buffer.length < length) return;
        const code = buffer.readInt32BE(4);
        const packet = buffer.subarray(0, length);
        buffer = buffer.subarray(length);
        if (code === SSL_REQUEST) socket.write("N");
        else if (code === CANCEL_REQUEST) socket.end();
        else if (code === PROTOCOL_3) {
          started = true;
          waiting.push({ connection, messages: [new Uint8Array(packet)] });
          void drain();
        } else socket.destroy();
        continue;
      }
      // Typed messages: type (1) + length (4, counting itself) + body.
      if (buffer.length < 5) return;
      const length = 1 + buffer.readInt32BE(1);
      if (buffer.length < length) return;
      const type = String.fromCharCode(buffer[0]!);
      const message = new Uint8Array(buffer.subarray(0, length));
      buffer = buffer.subarray(length);
      if (type === "X") {
        socket.end();
        return;
      }
      pending.push(message);
      // Sync ends an extended-protocol exchange, Query is one by itself; Flush asks for
      // the output so far, so it must run now too.
      if (type === "S" || type === "Q" || type === "H") {
        waiting.push({ connection, messages: pending });
        pending = [];
        void drain();
      }
    }
  });
  socket.on("error", () => {});
  socket.on("close", () => void release(connection));
}

const server = net.createServer(accept);
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address() as net.AddressInfo;
process.stdout.write(`READY postgres://postgres@127.0.0.1:${port}/postgres\n`);

let stopping = false;
async function stop(): Promise<void> {
  if (stopping) return;
  stopping = true;
  server.close();
  await db.close().catch(() => {});
  process.exit(0);
}
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());
process.stdin.on("end", () => void stop()).resume();
